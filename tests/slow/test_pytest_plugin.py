"""`pytest --pdcheck-sweep`: cells become items, failures show the verdict reason, results land in the run format."""

from __future__ import annotations

import json
import subprocess
import sys
import threading

from pdcheck.sweep.leases import GpuLeases

CLEAN = "fake-p1x1-d1x1-async-fixes-on"


def _pytest(tmp_path, *args):
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", *args],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_each_cell_is_an_item_and_a_failure_shows_the_verdict_reason(sweep_file, servers, tmp_path):
    """A clean cell against a broken PD fails with REGRESSION's reason; the run folder has its verdicts,
    summary and report."""
    base, _, bad = servers
    out = tmp_path / "results"
    proc = _pytest(
        tmp_path,
        "--pdcheck-sweep",
        str(sweep_file),
        "--pdcheck-only",
        CLEAN,
        "--pdcheck-out",
        str(out),
        "--pdcheck-baseline-url",
        base.url,
        "--pdcheck-pd-url",
        bad.url,
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "1 failed" in proc.stdout
    assert "c1: REGRESSION (fail): PD lost accuracy" in proc.stdout
    summary = json.loads((out / "summary.json").read_text())
    assert [r["verdict"] for r in summary["cells"][0]["results"]] == ["REGRESSION", "REGRESSION"]
    report = (out / "report.md").read_text()
    assert "REGRESSION" in report and "PD lost accuracy" in report, (
        "the session finishes the report"
    )


def test_passing_cell_passes_and_collects_only_sweep_items(sweep_file, servers, tmp_path):
    """With --pdcheck-sweep the session's items are the cells; a matching PD passes."""
    base, good, _ = servers
    (tmp_path / "test_other.py").write_text("def test_other():\n    assert False\n")
    proc = _pytest(
        tmp_path,
        "--pdcheck-sweep",
        str(sweep_file),
        "--pdcheck-only",
        CLEAN,
        "--pdcheck-out",
        str(tmp_path / "r"),
        "--pdcheck-baseline-url",
        base.url,
        "--pdcheck-pd-url",
        good.url,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "1 passed, 1 deselected" in proc.stdout


def test_bad_sweep_file_is_a_usage_error(tmp_path):
    """A sweep file that does not load stops pytest with the file's error, running nothing."""
    (tmp_path / "bad.yaml").write_text("name: x\nmodels: []\n")
    proc = _pytest(tmp_path, "--pdcheck-sweep", str(tmp_path / "bad.yaml"))
    assert proc.returncode == 4 and "no models" in proc.stderr


def test_leases_are_disjoint_and_wait_for_free_gpus(tmp_path):
    """Two holders never share a GPU; a third waits until one releases; one that needs more than
    exist takes them all (its servers share them)."""
    leases = GpuLeases(tmp_path / "l.json", [0, 1, 2, 3], poll_s=0.01)
    got = []
    third = leases.lease(3, holder="c")
    with leases.lease(2, holder="a") as a, leases.lease(2, holder="b") as b:
        assert set(a).isdisjoint(b) and len(a + b) == 4
        waiter = threading.Thread(target=lambda: got.append(third.__enter__()))
        waiter.start()
        waiter.join(0.2)
        assert got == [], "must wait while only 0 GPUs are free"
    waiter.join(5)
    assert len(got[0]) == 3
    third.__exit__(None, None, None)
    with leases.lease(5, holder="d") as every:  # more than exist: all of them, to share
        assert every == (0, 1, 2, 3)


def test_cpu_lease_is_one_at_a_time(tmp_path):
    """Without GPUs a lease is an exclusive token: two CPU topologies never run at once."""
    leases = GpuLeases(tmp_path / "l.json", [], poll_s=0.01)
    with leases.lease(3, holder="a") as first:
        assert first == ()
        assert leases._try_take(3, "b") is None
    assert leases._try_take(3, "b") == ()
