"""Race findings in the report: harness evidence, the named race per arm, injection precision."""

from __future__ import annotations

from pdcheck.report import render_markdown
from pdcheck.report.race import attributions, injection_results
from pdcheck.results.store import load_run

from .conftest import RACE_FINDINGS, CellPlan
from .mdparse import tables


def _race_part(text: str) -> str:
    return text.split("## Race findings", 1)[1].split("\n## ", 1)[0]


def test_harness_findings_are_shown_per_variant_with_an_example(make_run):
    """Status, the per-variant table, an example finding, and the note about a fix this vLLM lacks."""
    run = load_run(make_run([CellPlan("fixes-on")], race=RACE_FINDINGS))
    part = _race_part(render_markdown(run))
    assert "**fail** — 2 finding(s) reported" in part
    assert "This vLLM lacks zeroing" in part
    header, body = tables(part)[0]
    assert header[:2] == ["variant", "seeds with findings"] and body[0][:3] == [
        "full-attention",
        "20/20",
        "BLOCK_REUSE 21",
    ]
    assert "STALE_WRITE_INTO_CONSUMER_BLOCK at seed 3, step 19" in part
    assert [a.race for a in attributions(run)] == ["block-reuse"]


def test_injected_arms_are_attributed_and_their_precision_measured(make_run):
    """A flagged injection arm is named as the injected fault; the diverged questions are exactly the injected ones."""
    run = load_run(make_run([CellPlan("fixes-on"), CellPlan("inject-zero", drops={1: 60, 8: 60})]))
    assert [(a.race, a.rule) for a in attributions(run)] == [
        ("injected:zero-loaded-kv", "injected")
    ]
    results = injection_results(run)
    assert [
        (r.concurrency, r.precision.n_injected, r.precision.precision, r.precision.recall)
        for r in results
    ] == [(1, 60, 1.0, 1.0), (8, 60, 1.0, 1.0)]
    part = _race_part(render_markdown(run))
    assert "did not run in this sweep" in part
    precision_table = tables(part)[-1]
    assert precision_table[0] == [
        "arm",
        "c",
        "fault",
        "injected",
        "diverged",
        "precision",
        "recall",
    ]
    assert [row[3:] for row in precision_table[1]] == [["60", "60", "1.00", "1.00"]] * 2


def test_a_clean_run_names_no_race(make_run):
    """Nothing flagged and no harness findings: the report says no race is named."""
    part = _race_part(render_markdown(load_run(make_run([CellPlan("fixes-on")]))))
    assert "no race is named" in part
