"""Port slots are claimed across processes while their servers run. (In the slow tier: these start
processes.)"""

from __future__ import annotations

import fcntl
import subprocess
import sys
import tempfile
from pathlib import Path

from pdcheck.serving import serve_topology
from pdcheck.serving.gpus import GpuInventory
from pdcheck.serving.plan import plan_topology
from pdcheck.serving.ports import PortAllocator, default_allocator
from tests.fakes.stub_topology import STUB
from tests.unit.serving.conftest import make_cell


def test_a_slot_claimed_by_another_process_is_skipped(tmp_path):
    """Two processes with the same bucket never get the same slot, even before any server binds it."""
    code = (
        "from pdcheck.serving.ports import PortAllocator\n"
        "alloc = PortAllocator(bucket=4)  # claims last as long as the allocator\n"
        "p = alloc.server_ports()\n"
        "print(p.http, flush=True)\n"
        "import sys; sys.stdin.read()\n"
    )
    other = subprocess.Popen(
        [sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        theirs = int(other.stdout.readline())
        mine = PortAllocator(bucket=4).server_ports().http
        assert mine != theirs
    finally:
        other.stdin.close()
        other.wait(10)


def test_a_topologys_port_claims_are_given_up_when_it_stops(tmp_path):
    """While a topology of stand-ins serves, each server's and the proxy's slot is claimed (its
    lock file cannot be taken); once it has stopped, none is."""
    pid_dir = tmp_path / "pids"
    pid_dir.mkdir()
    cell = make_cell(
        matrix={"env": [{"STUB_MODE": "ok", "STUB_PID_DIR": str(pid_dir)}]},
        serving={"platform": "cpu", "ready_timeout_s": 30},
    )
    plan = plan_topology(
        cell,
        inventory=GpuInventory((), "none"),
        ports=default_allocator(),
        run_dir=tmp_path,
        launcher=[sys.executable, STUB],
    )
    http_ports = [s.ports.http for s in plan.servers] + [plan.proxy_port]
    with serve_topology(plan):
        assert [_claimable(p) for p in http_ports] == [False] * len(http_ports)
    assert [_claimable(p) for p in http_ports] == [True] * len(http_ports)


def _claimable(http_port: int) -> bool:
    """True when no open file description holds the slot's claim (what another process checks)."""
    lock = Path(tempfile.gettempdir()) / "pdcheck-ports" / f"{http_port}.lock"
    with open(lock, "a") as file:
        try:
            fcntl.flock(file, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            return False
        fcntl.flock(file, fcntl.LOCK_UN)
        return True
