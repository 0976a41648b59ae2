"""No child outlives an interrupted pdcheck: `pdcheck up`, `pdcheck proxy` and a library caller,
stopped by Ctrl-C or SIGTERM while servers start or while they serve (stand-in servers, real signals).

Moved out of tests/unit/serving: each test starts pdcheck in a subprocess, waits for real
processes and signals them, seconds per case.
"""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from tests.fakes.stub_topology import alive, default_ctrl_c, recorded_pids, wait_gone


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_proxy_stops_on_ctrl_c_or_sigterm(sig):
    """`pdcheck proxy` (on uvloop) answers, then exits promptly on Ctrl-C or SIGTERM."""
    import urllib.error
    import urllib.request

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    pdcheck = str(Path(sys.executable).with_name("pdcheck"))
    proc = subprocess.Popen(
        [
            pdcheck,
            "proxy",
            "--prefill",
            "http://127.0.0.1:1",
            "--decode",
            "http://127.0.0.1:2",
            "--port",
            str(port),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        preexec_fn=default_ctrl_c,
    )
    try:
        deadline = time.monotonic() + 30
        status = None
        while status is None and time.monotonic() < deadline:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2)
            except urllib.error.HTTPError as exc:
                status = exc.code  # 503: the proxy is up, its made-up backends are not
            except OSError:
                time.sleep(0.2)
        assert status == 503
        proc.send_signal(sig)
        proc.wait(timeout=15)
    finally:
        proc.kill()
        proc.wait()


def _stub_sweep(tmp_path, mode: str) -> str:
    """A sweep whose arm's vLLM 'executable' is the stand-in server (same pid via exec)."""
    from tests.fakes.stub_topology import STUB

    launcher = tmp_path / "fake-vllm"
    launcher.write_text(f'#!/bin/sh\nexec {sys.executable} {STUB} "$@"\n')
    launcher.chmod(0o755)
    (tmp_path / "pids").mkdir()
    sweep = {
        "name": "stub",
        "models": [{"name": "m", "path": "/models/m"}],
        "environments": [{"name": "stub", "vllm": str(launcher)}],
        "matrix": {
            "arms": [{"name": "s", "environment": "stub"}],
            "env": [{"STUB_MODE": mode, "STUB_PID_DIR": str(tmp_path / "pids")}],
        },
        "serving": {"platform": "cpu", "ready_timeout_s": 60},
    }
    path = tmp_path / "stub.yaml"
    path.write_text(json.dumps(sweep))  # JSON is YAML
    return str(path)


def _pdcheck_up(sweep: str, tmp_path: Path) -> subprocess.Popen[str]:
    pdcheck = str(Path(sys.executable).with_name("pdcheck"))
    return subprocess.Popen(
        [pdcheck, "up", sweep, "--run-dir", str(tmp_path / "run")],
        stdout=subprocess.PIPE,
        text=True,
        preexec_fn=default_ctrl_c,
    )


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
@pytest.mark.parametrize("phase", ["startup", "run"])
def test_interrupting_pdcheck_up_leaves_no_child(tmp_path, sig, phase):
    """`pdcheck up` interrupted (Ctrl-C or SIGTERM) while servers start or while it serves stops every server and child."""
    sweep = _stub_sweep(tmp_path, "never-healthy" if phase == "startup" else "ok")
    proc = _pdcheck_up(sweep, tmp_path)
    try:
        if phase == "run":
            assert proc.stdout.readline().startswith("baseline  http://127.0.0.1:")
        deadline = time.monotonic() + 60
        while len(recorded_pids(tmp_path / "pids")) < 6 and time.monotonic() < deadline:
            time.sleep(0.1)
        pids = recorded_pids(tmp_path / "pids")
        assert len(pids) == 6 and all(alive(p) for p in pids)
        proc.send_signal(sig)
        rc = proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert wait_gone(pids) == []
    assert (
        rc
        == {
            ("startup", signal.SIGINT): 130,
            ("startup", signal.SIGTERM): 143,
            ("run", signal.SIGINT): 0,
            ("run", signal.SIGTERM): 143,
        }[(phase, sig)]
    )


def test_up_prints_every_server_url(tmp_path):
    """`pdcheck up` prints the baseline, the proxy, and every prefill and decode server's own URL."""
    sweep = _stub_sweep(tmp_path, "ok")
    proc = _pdcheck_up(sweep, tmp_path)
    try:
        lines = []
        while not (lines and lines[-1].startswith("log ")):
            lines.append(proc.stdout.readline())
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
    urls = dict(
        line.split(None, 1)
        for line in lines
        if "  http://" in line and not line.startswith("decoder")
    )
    assert {"baseline", "pd", "prefill-0", "decode-0"} <= set(urls), lines
    assert len(set(urls.values())) == len(urls)


DRIVER = textwrap.dedent(
    """
    import sys
    from pathlib import Path
    sys.path.insert(0, {root!r})
    from tests.fakes.stub_topology import stub_plan
    from pdcheck.serving import serve_topology
    plan = stub_plan(Path({tmp!r}), {bucket}, mode={mode!r})
    with serve_topology(plan) as endpoints:
        print("READY", flush=True)
        import time
        time.sleep(120)
    """
)


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
@pytest.mark.parametrize("phase", ["startup", "run"])
def test_interrupting_pdcheck_leaves_no_child(tmp_path, worker_index, sig, phase):
    """Ctrl-C or SIGTERM to a pdcheck process, while servers start or while they serve, stops every server and child."""
    root = str(Path(__file__).resolve().parents[2])
    mode = "never-healthy" if phase == "startup" else "ok"
    code = DRIVER.format(root=root, tmp=str(tmp_path), bucket=worker_index, mode=mode)
    driver = subprocess.Popen(
        [sys.executable, "-c", code],
        stdout=subprocess.PIPE,
        text=True,
        cwd=root,
        preexec_fn=default_ctrl_c,
    )
    try:
        pid_dir = tmp_path / "pids"
        deadline = time.monotonic() + 60
        while (
            len(recorded_pids(pid_dir)) < 6 and time.monotonic() < deadline
        ):  # 3 servers, each with a child
            time.sleep(0.1)
        if phase == "run":
            line = driver.stdout.readline().strip()
            assert line == "READY", f"driver said {line!r} (exit {driver.poll()})"
        pids = recorded_pids(pid_dir)
        assert len(pids) == 6 and all(alive(p) for p in pids), (
            f"pids {pids}, alive {[alive(p) for p in pids]}"
        )
        driver.send_signal(sig)
        rc = driver.wait(timeout=60)
    finally:
        if driver.poll() is None:
            driver.kill()
    assert rc != 0
    assert wait_gone(pids) == [], "a server or its child outlived the interrupted pdcheck process"
