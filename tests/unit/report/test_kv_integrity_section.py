"""The KV-integrity section: blocks checked and mismatches per cell and level, the first
mismatches by question, and an injected arm's digest flags scored against its injection log."""

from __future__ import annotations

from pdcheck.analysis.kv_digest import ExtentMismatch, KvDigestSummary, OrderMismatch
from pdcheck.report.kv_integrity import kv_integrity_section
from pdcheck.report.markdown import render_markdown
from pdcheck.results.load import load_run
from tests.unit.report.conftest import CellPlan


def test_clean_and_injected_arms_show_blocks_mismatches_and_precision(make_run):
    """A clean arm: 0 mismatches over 400 blocks; the canary: its 5 injected questions, scored 1.00."""
    run = load_run(
        make_run(
            [CellPlan("fixes-on"), CellPlan("inject-zero", drops={1: 5, 8: 5})],
            kv_digest=True,
        )
    )
    section = kv_integrity_section(run)
    assert section is not None
    lines = section.splitlines()
    clean = [x for x in lines if "fixes-on" in x and x.startswith("|")]
    assert clean and all("| 400 | 0 | – | – |" in x for x in clean), clean
    canary = [x for x in lines if "inject-zero" in x and x.startswith("|")]
    assert canary and all("precision 1.00, recall 1.00" in x for x in canary), canary
    assert "First mismatches:" in section and "group 0, block 1" in section
    assert "## KV integrity" in render_markdown(run)


def test_no_digests_no_section(make_run):
    """A run whose servers wrote no digests has no KV-integrity section at all."""
    run = load_run(make_run([CellPlan("fixes-on")]))
    assert kv_integrity_section(run) is None
    assert "## KV integrity" not in render_markdown(run)


def test_loads_the_two_sides_disagree_on_are_listed_with_both_counts(make_run):
    """A load the decoder takes to hold another number of prompt tokens than the prefiller
    computed is listed with both counts, though no block's bytes differ."""
    extent = ExtentMismatch(3, "run-q00003", decoder_tokens=299, prefiller_tokens=300)
    summary = KvDigestSummary(
        20, 40, 0, (), (), n_extent_mismatches=20, extent_mismatches=(extent,)
    )
    run = load_run(
        make_run([CellPlan("fixes-on")], concurrency=(1,), kv_evidence={"kv_digest": summary})
    )
    section = kv_integrity_section(run)
    assert section is not None
    assert "20 loads; first q00003: prefiller computed 300 tokens, decoder took 299" in section


def test_an_advertised_order_disagreeing_with_the_block_table_is_listed_with_positions(make_run):
    """A load whose prefiller advertised its blocks out of table order is listed with the
    positions and what the blocks sent there hold; loads with no table are said unchecked."""
    order = OrderMismatch(3, "run-q00003", 0, 0, positions=(1, 2), held=(2, 1), block_size=128)
    summary = KvDigestSummary(
        20, 60, 0, (), (), n_order_mismatches=20, order_mismatches=(order,), order_unchecked=2
    )
    run = load_run(
        make_run([CellPlan("fixes-on")], concurrency=(1,), kv_evidence={"kv_digest": summary})
    )
    section = kv_integrity_section(run)
    assert section is not None
    assert (
        "20 loads; first: advertised block order disagrees with the block table at positions "
        "1, 2 (q00003, group 0: the blocks sent there hold tokens 256-383, tokens 128-255)"
    ) in section
    assert "Block order not checked for" in section and "(2 loads)" in section
