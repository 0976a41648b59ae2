"""Helpers for tests that run stand-in servers (`stub_server.py`) as real processes: where the
stand-in is, a server or topology of them, and checks that their processes are gone."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
import urllib.error
import urllib.request
from pathlib import Path

from pdcheck.serving import plan_topology
from pdcheck.serving.argv import CPU_LAUNCHER_MODULE
from pdcheck.serving.forkserver import FORKSERVER_ENV
from pdcheck.serving.gpus import GpuInventory
from pdcheck.serving.ports import PortAllocator
from pdcheck.serving.process import ServerProcess
from tests.unit.serving.conftest import make_cell

STUB = str(Path(__file__).resolve().with_name("stub_server.py"))


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie still answers kill(0); it has no resources left, so it counts as gone.
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def default_ctrl_c() -> None:
    """preexec_fn: the child gets SIGINT as from a terminal, whatever the test run inherited.

    An ignored SIGINT is inherited: a shell ignores it for background jobs, so `make test &` or
    `nohup .ci/run &` hands SIG_IGN to every pytest worker and its children, and a Ctrl-C test
    would then test that instead of pdcheck (it timed out that way in a backgrounded CI run).
    """
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})


def recorded_pids(pid_dir: Path) -> list[int]:
    return [int(p) for f in pid_dir.glob("*.pids") for p in f.read_text().split()]


def wait_gone(pids: list[int], timeout_s: float = 30.0) -> list[int]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and any(alive(p) for p in pids):
        time.sleep(0.05)
    return [p for p in pids if alive(p)]


def stub(tmp_path: Path, mode: str, port: int, *, grace_s: float = 5.0) -> ServerProcess:
    pid_dir = tmp_path / "pids"
    pid_dir.mkdir(exist_ok=True)
    return ServerProcess(
        [sys.executable, STUB, "serve", "m", "--port", str(port)],
        name=f"{mode}-0",
        url=f"http://127.0.0.1:{port}",
        log_path=tmp_path / "logs" / f"{mode}-0.log",
        env={"STUB_MODE": mode, "STUB_PID_DIR": str(pid_dir)},
        grace_s=grace_s,
    )


NO_GPUS = GpuInventory((), "none")


def stub_plan(tmp_path: Path, bucket: int, *, mode: str = "ok", arm: str = "fixes-on"):
    pid_dir = tmp_path / "pids"
    pid_dir.mkdir(exist_ok=True)
    cell = make_cell(
        matrix={"arms": [arm], "env": [{"STUB_MODE": mode, "STUB_PID_DIR": str(pid_dir)}]},
        serving={"platform": "cpu", "ready_timeout_s": 30},
    )
    return plan_topology(
        cell,
        inventory=NO_GPUS,
        ports=PortAllocator(bucket=bucket),
        run_dir=tmp_path,
        launcher=[sys.executable, STUB],
    )


def complete(url: str) -> tuple[int, dict]:
    req = urllib.request.Request(
        url + "/v1/completions",
        data=b'{"prompt": "Q", "max_tokens": 4}',
        headers={"Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(req, timeout=20) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def stop_a_queued_launcher(python: str, env: dict[str, str], socket_path: str) -> None:
    """Start pdcheck's launcher for the fork server at `socket_path`, wait until it says its
    request is sent (queued while the fork server imports), then stop it with SIGTERM; it must
    exit 128 + SIGTERM, as a launcher stopped before its server started does."""
    queued = subprocess.Popen(
        [python, "-m", CPU_LAUNCHER_MODULE, "serve", "m", "--port", "1"],
        env={**env, FORKSERVER_ENV: socket_path},
        stderr=subprocess.PIPE,
        text=True,
        process_group=0,
    )
    assert queued.stderr is not None
    assert "asked the vLLM fork server" in queued.stderr.readline()
    queued.send_signal(signal.SIGTERM)
    assert queued.wait(timeout=30) == 128 + signal.SIGTERM


def standin_vllm(tmp_path: Path, *, import_s: float = 0.0) -> Path:
    """A `vllm` whose CLI import sets a variable (as vLLM's sets nine) and takes `import_s`, and
    whose `main()` runs the stub server on the argv."""
    site = tmp_path / "site"
    cli = site / "vllm" / "entrypoints" / "cli"
    cli.mkdir(parents=True)
    for folder in (site / "vllm", site / "vllm" / "entrypoints", cli):
        (folder / "__init__.py").write_text("")
    (cli / "main.py").write_text(
        textwrap.dedent(
            f"""
            import os, runpy, sys, time
            os.environ["STUB_SET_BY_IMPORT"] = "yes"
            time.sleep({import_s})
            def main():
                sys.argv = [{STUB!r}, *sys.argv[1:]]
                runpy.run_path({STUB!r}, run_name="__main__")
            """
        )
    )
    return site


def parent_of(pid: int) -> int:
    """The parent process of `pid` (a forked server's: its fork server)."""
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
