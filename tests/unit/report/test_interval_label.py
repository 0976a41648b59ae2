"""Every interval is labelled with the level its test computed it at, never a fixed number."""

from __future__ import annotations

import io
import re
from dataclasses import replace
from pathlib import Path

from rich.console import Console

from pdcheck.analysis.verdict import Status, Verdict
from pdcheck.report import render_markdown
from pdcheck.report.rows import ResultRow, build_rows
from pdcheck.report.sections import results_table
from pdcheck.report.terminal import render_summary
from pdcheck.results.load import load_run

from .conftest import CellPlan
from .mdparse import tables

PLANS = [CellPlan("fixes-on"), CellPlan("inject-zero", drops={1: 5, 8: 60})]


def _levels_in_reasons(run) -> set[str]:
    """The levels the verdicts' own reasons give their intervals ("Δ ..., 95% CI [...]")."""
    return {
        m
        for cell in run.cells
        for entry in cell.verdicts.values()
        for m in re.findall(r"(≥[\d.]+%) CI \[", entry.verdict.reason)
    }


def test_the_report_and_terminal_name_the_level_the_design_used(make_run):
    """With early stop the interval widens to 1 − 2.2·alpha/k: the labels follow, as the reasons do."""
    run = load_run(make_run(PLANS, analysis={"early_stop": True}))
    (level,) = _levels_in_reasons(run)
    assert level != "≥89%", "early stop's margin looks must widen the interval"
    text = render_markdown(run)
    header, _ = tables(text)[0]
    assert header[4] == f"Δ pts ({level} CI)"
    methodology = text.split("## Methodology", 1)[1]
    assert f"shown as an interval at {level} (proven: 1 − 2.2·α/k" in methodology
    terminal = Console(file=io.StringIO(), width=120, color_system=None)
    terminal.print(render_summary(run))
    assert f"Δ pts ({level} CI)" in terminal.file.getvalue().splitlines()[1]


def test_without_early_stop_the_interval_is_at_one_minus_two_alpha(make_run):
    """One look: each end at 0.05, so the proven two-sided level is 1 − 2.2·0.05 = 89%
    (the lower end holds at ≥ 1 − 1.2·alpha, `stats.drop_bounds`), in the table and the JSON rows."""
    run = load_run(make_run(PLANS))
    assert _levels_in_reasons(run) == {"≥89%"}
    assert tables(render_markdown(run))[0][0][4] == "Δ pts (≥89% CI)"
    assert {round(r.ci_level, 12) for r in build_rows(run)} == {0.89}


def _row(concurrency: int, level: float | None) -> ResultRow:
    return ResultRow(
        cell="c",
        cell_id="0" * 8,
        dirname="c--00000000",
        model="m",
        arm="fixes-on",
        concurrency=concurrency,
        canary=False,
        status=Status.PASS,
        verdict=Verdict.PASS,
        reason="within the margin",
        n=100,
        delta_pts=0.0,
        ci_low_pts=-2.0,
        ci_high_pts=2.0,
        ci_level=level,
    )


def test_rows_at_different_levels_each_name_their_own():
    """A table mixing levels (or folders that did not record one) labels every interval."""
    header, body = tables(results_table([_row(1, 0.9), _row(8, 0.95), _row(16, None)]))[0]
    assert header[4] == "Δ pts (CI, level per row)"
    assert [row[4] for row in body] == [
        "+0.0 [-2.0, +2.0] (≥90%)",
        "+0.0 [-2.0, +2.0] (≥95%)",
        "+0.0 [-2.0, +2.0] (level not recorded)",
    ]
    unrecorded = [replace(_row(1, None), concurrency=c) for c in (1, 8)]
    assert tables(results_table(unrecorded))[0][0][4] == "Δ pts (CI, level not recorded)"


def test_a_folder_that_did_not_record_the_level_says_so():
    """A schema-1 folder (intervals then at 1 − alpha) stored no design: no level is made up for it."""
    run = load_run(Path(__file__).parents[1] / "sweep" / "data" / "v1-run")
    assert tables(render_markdown(run))[0][0][4] == "Δ pts (CI, level not recorded)"
    assert "their level is not recorded" in render_markdown(run).split("## Methodology", 1)[1]
