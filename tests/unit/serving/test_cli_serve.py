"""`pdcheck up` and `pdcheck proxy` command lines: dry runs, refusals and their exit codes."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pdcheck.cli import main
from pdcheck.errors import ExitCode
from tests.unit.serving.test_process import default_ctrl_c


def test_up_dry_run_prints_every_server_and_the_proxy(capsys, tmp_path):
    """--dry-run prints each server's env + argv and the proxy command, and starts nothing (exit 0)."""
    rc = main(
        [
            "up",
            "--model",
            "fixture:tiny-llama-random",
            "--platform",
            "cpu",
            "--serve-arg=--max-model-len",
            "--serve-arg=2048",
            "--run-dir",
            str(tmp_path),
            "--dry-run",
        ]
    )
    out = capsys.readouterr().out
    assert rc == ExitCode.OK
    assert out.count("pdcheck._vllm.launch serve") == 3 and "--max-model-len 2048" in out
    assert (
        '"kv_role":"kv_producer","kv_buffer_device":"cpu"' in out
        and "pdcheck proxy --prefill http://127.0.0.1:" in out
    )
    # The CPU-only idle back-off and the in-EngineCore model (TP 1) show in a dry run, on every server.
    assert out.count("PDCHECK_IDLE_BACKOFF_MS=16") == 3 and "PDCHECK_SHM_SPIN_SLEEP_US" not in out
    assert (
        out.count("VLLM_ENABLE_V1_MULTIPROCESSING=0") == 3
        and out.count("--distributed-executor-backend uni") == 3
    )
    assert not (tmp_path / "logs").exists()


def test_up_needs_exactly_one_source(capsys):
    """Neither a sweep nor --model (or both) is a usage error, exit 3."""
    assert main(["up"]) == ExitCode.CONFIG
    assert main(["up", "sweeps/cpu-smoke.yaml", "--model", "x", "--dry-run"]) == ExitCode.CONFIG


def test_up_with_a_multi_cell_sweep_lists_the_cells(capsys):
    """A sweep with several cells and no --cell is refused with the cell names (exit 3)."""
    assert main(["up", "cpu-smoke", "--dry-run"]) == ExitCode.CONFIG
    assert "tiny-llama-p1x1-d1x1-sync-fixes-on" in capsys.readouterr().err


def test_up_refuses_a_gpu_topology_without_gpus(capsys):
    """A GPU topology on a machine with no GPUs is refused before anything starts, naming the counts."""
    rc = main(
        ["up", "--model", "Qwen/Qwen3-0.6B", "--platform", "gpu", "--prefill-tp", "2", "--dry-run"]
    )
    assert rc == ExitCode.CONFIG
    assert "needs 4 GPUs" in capsys.readouterr().err


def test_proxy_on_a_taken_port_is_an_infra_error(capsys):
    """`pdcheck proxy --port P` with P taken fails at once with PortUnavailable (exit 2)."""
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        rc = main(
            [
                "proxy",
                "--prefill",
                "http://127.0.0.1:1",
                "--decode",
                "http://127.0.0.1:2",
                "--port",
                str(port),
            ]
        )
    assert rc == ExitCode.INFRA
    assert f"127.0.0.1:{port} is already in use" in capsys.readouterr().err


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
    from tests.unit.serving.test_process import STUB

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


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
@pytest.mark.parametrize("phase", ["startup", "run"])
def test_interrupting_pdcheck_up_leaves_no_child(tmp_path, sig, phase):
    """`pdcheck up` interrupted (Ctrl-C or SIGTERM) while servers start or while it serves stops every server and child."""
    from tests.unit.serving.test_process import alive, recorded_pids, wait_gone

    sweep = _stub_sweep(tmp_path, "never-healthy" if phase == "startup" else "ok")
    pdcheck = str(Path(sys.executable).with_name("pdcheck"))
    proc = subprocess.Popen(
        [pdcheck, "up", sweep, "--run-dir", str(tmp_path / "run")],
        stdout=subprocess.PIPE,
        text=True,
        preexec_fn=default_ctrl_c,
    )
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
    pdcheck = str(Path(sys.executable).with_name("pdcheck"))
    proc = subprocess.Popen(
        [pdcheck, "up", sweep, "--run-dir", str(tmp_path / "run")],
        stdout=subprocess.PIPE,
        text=True,
        preexec_fn=default_ctrl_c,
    )
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
