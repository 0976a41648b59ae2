"""`pdcheck sweep` and `pdcheck merge` through the CLI, in attach mode against fake OpenAI servers."""

from __future__ import annotations

import json

from pdcheck.analysis.verdict import Verdict
from pdcheck.cli import main
from pdcheck.results import load_run

CLEAN = "fake-p1x1-d1x1-async-fixes-on"
CANARY = "fake-p1x1-d1x1-async-inject-zero"


def _sweep(sweep_file, out, cell, pd_url, base_url, *extra):
    return main(
        [
            "sweep",
            str(sweep_file),
            "--out",
            str(out),
            "--only",
            cell,
            "--baseline-url",
            base_url,
            "--pd-url",
            pd_url,
            *extra,
        ]
    )


def test_clean_cell_that_matches_its_baseline_exits_0(sweep_file, servers, tmp_path):
    """A clean arm whose PD answers equal the baseline's: PASS at every concurrency, exit 0, files written."""
    base, good, _ = servers
    assert _sweep(sweep_file, tmp_path / "r", CLEAN, good.url, base.url) == 0
    run = load_run(tmp_path / "r")
    (cell,) = run.cells
    assert sorted(cell.verdicts) == [1, 4]
    assert all(v.verdict.verdict is Verdict.PASS for v in cell.verdicts.values())
    assert (tmp_path / "r" / "junit.xml").is_file()
    summary = json.loads((tmp_path / "r" / "summary.json").read_text())
    assert summary["exit_code"] == 0


def test_regression_in_a_clean_cell_exits_1(sweep_file, servers, tmp_path):
    """A clean arm whose PD answers are all wrong: REGRESSION, exit 1, the junit failure carries the reason."""
    base, _, bad = servers
    assert _sweep(sweep_file, tmp_path / "r", CLEAN, bad.url, base.url) == 1
    junit = (tmp_path / "r" / "junit.xml").read_text()
    assert 'type="REGRESSION"' in junit and "PD lost accuracy" in junit


def test_canary_flagged_exits_0_and_unflagged_canary_exits_1(sweep_file, servers, tmp_path):
    """An injected-fault canary must be flagged: flagged → exit 0; PASS → exit 1 (detection lost)."""
    base, good, bad = servers
    assert _sweep(sweep_file, tmp_path / "flagged", CANARY, bad.url, base.url) == 0
    assert _sweep(sweep_file, tmp_path / "missed", CANARY, good.url, base.url) == 1
    summary = json.loads((tmp_path / "missed" / "summary.json").read_text())
    assert "canary NOT flagged" in summary["cells"][0]["results"][0]["reason"]


def test_race_canary_levels_where_the_race_cannot_fire_are_controls(sweep_file, servers, tmp_path):
    """fixes-off: c1 (and every level with async off) must PASS; with async on, c4 must be flagged."""
    base, good, bad = servers
    sweep_file.write_text(
        sweep_file.read_text().replace(
            "arms: [fixes-on, inject-zero]", "arms: [fixes-off]\n  async_scheduling: [true, false]"
        )
    )
    assert (
        _sweep(sweep_file, tmp_path / "sync", "fake-p1x1-d1x1-sync-fixes-off", good.url, base.url)
        == 0
    )
    assert (
        _sweep(sweep_file, tmp_path / "async", "fake-p1x1-d1x1-async-fixes-off", good.url, base.url)
        == 1
    )
    results = json.loads((tmp_path / "async" / "summary.json").read_text())["cells"][0]["results"]
    assert [(r["concurrency"], r["status"], r["canary"]) for r in results] == [
        (1, "pass", False),
        (4, "fail", True),
    ]
    assert "concurrency 1" in results[0]["reason"] and "canary NOT flagged" in results[1]["reason"]
    assert (
        _sweep(
            sweep_file, tmp_path / "flagged-c1", "fake-p1x1-d1x1-async-fixes-off", bad.url, base.url
        )
        == 1
    )


def test_unreachable_pd_server_is_infra_error_exit_2(sweep_file, servers, tmp_path):
    """A PD URL nobody answers: the cell is INFRA-ERROR with a failure.json, never a pass; exit 2."""
    base, _, _ = servers
    assert _sweep(sweep_file, tmp_path / "r", CLEAN, "http://127.0.0.1:9", base.url) == 2
    cell = load_run(tmp_path / "r").cells[0]
    assert all(v.verdict.verdict is Verdict.INFRA_ERROR for v in cell.verdicts.values())
    assert cell.unit("pd", 1, 0).failure is not None


def test_bad_input_exits_3_and_starts_nothing(sweep_file, servers, tmp_path):
    """Bad options are refused with exit 3 before any request is sent or any folder is made."""
    base, good, _ = servers
    assert main(["sweep", str(sweep_file), "--out", str(tmp_path / "a"), "--shard", "3/2"]) == 3
    assert main(["sweep", str(sweep_file), "--out", str(tmp_path / "b"), "--only", "nope"]) == 3
    # Attach mode needs exactly one cell.
    assert (
        main(
            [
                "sweep",
                str(sweep_file),
                "--out",
                str(tmp_path / "c"),
                "--baseline-url",
                base.url,
                "--pd-url",
                good.url,
            ]
        )
        == 3
    )
    assert main(["sweep", str(sweep_file), "--out", str(tmp_path / "d"), "--pd-url", good.url]) == 3
    assert not any((tmp_path / n).exists() for n in "abcd")
    assert base.requests == [] and good.requests == []


def test_out_folder_that_holds_a_run_is_refused(sweep_file, servers, tmp_path):
    """--out never overwrites a run: exit 3, pointing at --resume."""
    base, good, _ = servers
    assert _sweep(sweep_file, tmp_path / "r", CLEAN, good.url, base.url) == 0
    assert _sweep(sweep_file, tmp_path / "r", CLEAN, good.url, base.url) == 3


def test_resume_of_a_finished_run_sends_no_request(sweep_file, servers, tmp_path):
    """--resume runs only missing units: on a finished run nothing is asked again, the verdicts stay."""
    base, good, _ = servers
    assert _sweep(sweep_file, tmp_path / "r", CLEAN, good.url, base.url) == 0
    asked = len(base.requests) + len(good.requests)
    assert (
        main(
            [
                "sweep",
                "--resume",
                str(tmp_path / "r"),
                "--baseline-url",
                base.url,
                "--pd-url",
                good.url,
            ]
        )
        == 0
    )
    assert len(base.requests) + len(good.requests) == asked


def test_early_stop_ends_a_collapsing_unit_and_skips_higher_levels(sweep_file, servers, tmp_path):
    """--early-stop: a PD that is always wrong stops before the last question, is REGRESSION, and c4 is not run."""
    base, _, bad = servers
    assert _sweep(sweep_file, tmp_path / "r", CLEAN, bad.url, base.url, "--early-stop") == 1
    cell = load_run(tmp_path / "r").cells[0]
    pd_c1 = cell.unit("pd", 1, 0)
    assert 0 < len(pd_c1.records()) < 16 and pd_c1.early_stop.verdict is Verdict.REGRESSION
    assert pd_c1.summary.stopped and pd_c1.summary.n == len(pd_c1.records())
    first = cell.verdicts[1].verdict
    assert first.verdict is Verdict.REGRESSION and first.reason.startswith("early stop, look")
    assert cell.unit("pd", 4, 0) is None, "a level after a flagged one is not run"
    carried = cell.verdicts[4]
    assert carried.verdict.verdict is Verdict.REGRESSION and carried.carried_from == 1
    assert "c1 was REGRESSION" in carried.verdict.reason
