"""The sweep's closing summary in a terminal: one line per cell and concurrency, at any width."""

from __future__ import annotations

import io
from dataclasses import replace

import pytest
from rich.console import Console

import pdcheck.cli.sweep as sweep_cli
from pdcheck.analysis.verdict import Status, Verdict
from pdcheck.cli import main
from pdcheck.report.rows import build_rows, short_reason
from pdcheck.results.load import load_run
from pdcheck.sweep.events import SweepEvent

from .conftest import CellPlan, write_run

PLANS = [
    CellPlan("fixes-on"),
    CellPlan("inject-zero", drops={1: 5, 8: 60}),
    CellPlan("fixes-on", model="tiny-granite", infra_at=(8,)),
    CellPlan("inject-stale", model="tiny-granite", drops={8: 40}),
]


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    return write_run(tmp_path_factory.mktemp("run"), PLANS)


def _merge_output(run_dir, out, monkeypatch, width: int) -> tuple[int, list[str]]:
    """`pdcheck merge` of one folder, printed on a terminal `width` columns wide."""
    terminal = Console(file=io.StringIO(), width=width, color_system=None)
    monkeypatch.setattr(sweep_cli, "console", terminal)
    code = main(["merge", str(run_dir), "--out", str(out)])
    return code, terminal.file.getvalue().splitlines()


def _words(line: str) -> str:
    return " ".join(line.split())


@pytest.mark.parametrize("width", [80, 120])
def test_each_result_is_one_line_under_its_cell(run_dir, tmp_path, monkeypatch, width):
    """Per cell a name line, then exactly one line per concurrency level, none wider than the terminal."""
    code, lines = _merge_output(run_dir, tmp_path / f"merged{width}", monkeypatch, width)
    run = load_run(run_dir)
    rows = build_rows(run)
    table = lines[: next(i for i, line in enumerate(lines) if line.startswith("results: "))]
    # The title and the column header, one name line per cell, one line per result.
    assert len(table) == 2 + len(run.cells) + len(rows), "\n".join(table)
    assert all(len(line) <= width for line in table)
    for cell in run.cells:
        start = next(i for i, line in enumerate(table) if line.startswith(cell.name))
        levels = table[start + 1 : start + 1 + len(cell.concurrency)]
        assert [line.split()[0] for line in levels] == [f"c{c}" for c in cell.concurrency]
    assert code == 1


def test_a_line_says_verdict_delta_interval_n_kv_and_a_short_reason(run_dir, tmp_path, monkeypatch):
    """The numbers the report's table has for the result, and a reason of a few words."""
    _, lines = _merge_output(run_dir, tmp_path / "merged", monkeypatch, 120)
    assert "Δ pts (≥89% CI)" in lines[1] and "KV tokens" in lines[1]
    canary = lines.index("tiny-llama-p1x1-d1x1-async-inject-zero · canary")
    assert (
        _words(lines[canary + 2]) == "c8 REGRESSION -30.0 [-38.1, -20.5] 200 8,000 canary flagged"
    )
    infra = lines.index("tiny-granite-p1x1-d1x1-async-fixes-on")
    assert _words(lines[infra + 2]) == "c8 INFRA-ERROR – – – RuntimeError in pd c8"


def test_short_reasons_keep_the_headline_and_what_the_canary_and_gate_make_of_it(make_run):
    """The reason's first clause, said as the run judges it: canary flagged or not, gate failed."""
    rows = build_rows(load_run(make_run(PLANS, n=40, analysis={"margin_pts": 2.0})))
    short = {(r.cell.split("-async-")[1], r.model, r.concurrency): r.short_reason for r in rows}
    assert short == {
        ("fixes-on", "tiny-llama", 1): "underpowered, fails the gate",
        ("fixes-on", "tiny-llama", 8): "underpowered, fails the gate",
        ("inject-zero", "tiny-llama", 1): "canary flagged",
        ("inject-zero", "tiny-llama", 8): "canary flagged",
        ("fixes-on", "tiny-granite", 1): "underpowered, fails the gate",
        ("fixes-on", "tiny-granite", 8): "RuntimeError in pd c8",
        ("inject-stale", "tiny-granite", 1): "canary NOT flagged, underpowered",
        ("inject-stale", "tiny-granite", 8): "canary flagged",
    }
    assert all(len(r.short_reason) < 40 < len(r.reason) for r in rows if r.verdict != "INFRA-ERROR")


def test_a_carried_level_and_an_early_stop_read_as_such():
    """An early stop's note is not the headline; a level that carried a flag says from where."""
    stopped = short_reason(
        verdict=Verdict.PASS,
        status=Status.PASS,
        canary=False,
        reason="early stop, look 2 after 38 pairs: the drop is within the 20-pt margin "
        "(one-sided 97.5% bound), drop 0.0 pts; within the margin: the drop is at most 9.18 pts",
    )
    assert stopped == "within the margin"
    carried = {"reason": "early stop: c1 was REGRESSION", "carried_from": 1}
    assert (
        short_reason(verdict=Verdict.REGRESSION, status=Status.PASS, canary=True, **carried)
        == "canary flagged at c1"
    )
    assert (
        short_reason(verdict=Verdict.REGRESSION, status=Status.FAIL, canary=False, **carried)
        == "flagged at c1"
    )


def test_live_verdict_lines_take_one_line_and_failures_keep_their_whole_message(monkeypatch):
    """While the sweep runs, a verdict (its whole reason is in the report) never wraps; a failure does."""
    terminal = Console(file=io.StringIO(), width=80, color_system=None)
    monkeypatch.setattr(sweep_cli, "console", terminal)
    reason = "within the margin: the drop is at most 9.18 pts ≤ 20.00 " * 4
    event = SweepEvent(
        kind="verdict",
        message=f"tiny-llama-p1x1-d1x1-sync-fixes-on c1: PASS ({reason})",
        cells_done=0,
        cells_total=1,
        current_cell=None,
        phase=None,
        questions_done=0,
        questions_total=50,
        elapsed_s=53.0,
        verdicts={},
        server_starts=0,
    )
    with sweep_cli.LiveDisplay() as display:
        display.update(event)
        display.update(replace(event, kind="failure", message=f"ServerCrashed: {reason}"))
    verdict, *failure = terminal.file.getvalue().splitlines()
    assert verdict.endswith("…") and len(verdict) <= 80
    assert " ".join(" ".join(failure).split()).endswith(" ".join(reason.split()))
