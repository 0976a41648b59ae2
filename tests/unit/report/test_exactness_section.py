"""The report's bit-exact and prefix-caching sections, read from the store as a sweep wrote it."""

from __future__ import annotations

from pdcheck.contracts.server_records import KvTransferMetrics
from pdcheck.report.exactness import exactness_section
from pdcheck.report.markdown import render_markdown
from pdcheck.report.prefix_cache import prefix_cache_section
from pdcheck.results.load import load_run
from pdcheck.results.schema import KvEvidence
from pdcheck.results.store import CellStore
from tests.unit.report.conftest import CellPlan

EXACT_CPU = {"bit_exact": True, "platform": "cpu"}


def test_the_section_names_the_cells_judged_exactly_and_each_divergence(make_run):
    """An exact cell with one divergent question at c1: the section says which cells were judged
    exactly, gives identical/pairs per level and lists the divergence with its margin."""
    run = load_run(
        make_run([CellPlan("fixes-on", drops={1: 1})], concurrency=(1, 8), serving=EXACT_CPU)
    )
    section = exactness_section(run)
    assert section is not None
    assert "Judged exactly: tiny-llama-p1x1-d1x1-sync-fixes-on." in section
    rows = [line for line in section.splitlines() if line.startswith("| tiny-llama")]
    assert "| 1 | exactly | 199/200 | q00000 at token 3 |" in rows[0], rows
    assert "| 8 | exactly | 200/200 | – |" in rows[1], rows
    assert "float32" in section  # the reason: the measured dtype
    assert "q00000 r0 at token 3: baseline 't3', PD 't9999'" in section
    assert "## Bit-exact judging" in render_markdown(run)


def test_no_bit_exact_cell_no_section(make_run):
    """A run without the mode has no bit-exact section."""
    run = load_run(make_run([CellPlan("fixes-on")], concurrency=(1,)))
    assert exactness_section(run) is None and "## Bit-exact" not in render_markdown(run)


def test_prefix_caching_levels_show_their_local_hits_or_none(make_run):
    """The prefix-caching arm's levels show the decoders' local prefix-cache tokens beside the
    tokens read; a level without any local hit is marked: it proved nothing about partial hits."""
    root = make_run([CellPlan("prefix-caching")], concurrency=(1, 8))
    cell = load_run(root).cells[0]
    assert cell.provenance is not None
    CellStore(root, cell.dirname, cell.provenance).write_kv(
        8,
        0,
        KvEvidence(
            decoders=(KvTransferMetrics(external_kv_tokens=900.0, local_cache_hit_tokens=640.0),)
        ),
    )
    section = prefix_cache_section(load_run(root))
    assert section is not None
    rows = [line for line in section.splitlines() if line.startswith("| tiny-llama")]
    assert "| 1 | 0 | 1000 | **none** |" in rows[0], rows
    assert "| 8 | 640 | 900 | yes |" in rows[1], rows
    assert prefix_cache_section(load_run(make_run([CellPlan("fixes-on")]))) is None
