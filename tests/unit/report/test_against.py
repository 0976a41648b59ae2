"""`--against`: results whose verdict or accuracy changed come first, with what they were before."""

from __future__ import annotations

from pdcheck.report import render_markdown
from pdcheck.report.against import compare_rows
from pdcheck.report.rows import ResultRow
from pdcheck.results.store import load_run

from .conftest import CellPlan
from .mdparse import tables


def _row(cell: str, c: int, verdict: str = "PASS", pd: float | None = 0.6) -> ResultRow:
    return ResultRow(
        cell=cell,
        cell_id="id",
        dirname=f"{cell}--id",
        model="m",
        arm="a",
        concurrency=c,
        canary=False,
        status="pass",
        verdict=verdict,
        reason="",
        pd_accuracy=pd,
    )


def test_changed_and_new_results_come_first_in_the_new_runs_order():
    """Verdict change, accuracy change ≥ 0.1 pt, and new results lead; the rest keep their order."""
    old = [_row("a", 1), _row("b", 1), _row("c", 1), _row("d", 1, pd=0.6), _row("gone", 1)]
    new = [
        _row("a", 1),
        _row("b", 1, verdict="REGRESSION"),
        _row("c", 1, pd=0.6004),
        _row("d", 1, pd=0.59),
        _row("e", 1),
    ]
    result = compare_rows(new, old)
    assert [r.cell for r in result.rows] == ["b", "d", "e", "a", "c"]
    assert result.changed == {("b", 1), ("d", 1), ("e", 1)}
    assert result.removed == (("gone", 1),)
    assert result.before[("b", 1)] == "was PASS, PD 60.0%"
    assert result.before[("a", 1)].startswith("same: ")
    assert ("e", 1) not in result.before


def test_report_against_an_older_run_leads_with_the_regressed_cell(make_run):
    """Main passed everywhere, the PR regressed one cell at c8: that row is first and says what it was."""
    main = load_run(make_run([CellPlan("fixes-on"), CellPlan("fixes-on", model="tiny-granite")]))
    pr = load_run(
        make_run([CellPlan("fixes-on"), CellPlan("fixes-on", model="tiny-granite", drops={8: 60})])
    )
    text = render_markdown(pr, against=main)
    header, body = tables(text)[0]
    assert header[-1] == "Before"
    first = body[0]
    assert "tiny-granite" in first[0] and first[1] == "8" and "REGRESSION" in first[-2]
    assert first[-1] == "was PASS, PD 60.0%"
    assert all(row[-1].startswith("same: PASS") for row in body[1:])
    assert "1 result(s) changed" in text
