"""Servers that share a GPU start one after another, each once the ones before it are ready:
vLLM measures its memory as the drop in the device's free memory during its own start, so a
neighbour starting at the same time would be counted as its own. Stand-in servers on a
simulated one-GPU machine, for `pdcheck up`'s topology and for a sweep's PD job."""

from __future__ import annotations

import json
import sys

import pytest

from pdcheck.serving import serve_topology
from pdcheck.serving.gpus import Gpu, GpuInventory
from pdcheck.serving.plan import plan_topology
from pdcheck.serving.ports import default_allocator
from pdcheck.serving.process import ServerProcess
from pdcheck.sweep.serving_backend import ServingBackend
from tests.fakes.stub_topology import STUB, recorded_pids, wait_gone
from tests.unit.serving.conftest import make_cell

ONE_GPU = GpuInventory((Gpu(0, "sim", 81559),), "nvidia-smi")


@pytest.fixture
def starts(monkeypatch):
    """(server name, the names of the servers already answering /health) at each start."""
    started: list[ServerProcess] = []
    seen: list[tuple[str, set[str]]] = []
    real_start = ServerProcess.start

    def start(self, *args, **kwargs):
        seen.append((self.name, {p.name for p in started if p.is_healthy()}))
        started.append(self)
        return real_start(self, *args, **kwargs)

    monkeypatch.setattr(ServerProcess, "start", start)
    return seen


def _cell(tmp_path):
    pid_dir = tmp_path / "pids"
    pid_dir.mkdir(exist_ok=True)
    return make_cell(
        matrix={"env": [{"STUB_MODE": "ok", "STUB_PID_DIR": str(pid_dir)}]},
        serving={"platform": "gpu", "ready_timeout_s": 30},
    )


def _env_of(tmp_path, port):
    return json.loads((tmp_path / "pids" / f"{port}.env.json").read_text())


def test_a_topology_on_one_gpu_starts_each_server_once_the_ones_before_are_ready(tmp_path, starts):
    """Prefill, decode and baseline on GPU 0: each starts after the earlier ones answer /health,
    each with CUDA_VISIBLE_DEVICES=0 and a third of 0.9 of the GPU's memory."""
    plan = plan_topology(
        _cell(tmp_path),
        inventory=ONE_GPU,
        ports=default_allocator(),
        run_dir=tmp_path,
        launcher=[sys.executable, STUB],
    )
    with serve_topology(plan):
        for server in plan.servers:
            assert _env_of(tmp_path, server.ports.http)["CUDA_VISIBLE_DEVICES"] == "0"
            assert server.argv[server.argv.index("--gpu-memory-utilization") + 1] == "0.3"
        pids = recorded_pids(tmp_path / "pids")
    assert starts == [
        ("prefill-0", set()),
        ("decode-0", {"prefill-0"}),
        ("baseline-0", {"prefill-0", "decode-0"}),
    ]
    assert wait_gone(pids) == []


def test_a_sweep_pd_job_on_one_gpu_starts_its_decoder_once_the_prefill_is_ready(tmp_path, starts):
    """The sweep backend starts a PD job's prefills apart (to keep them for the next job); on a
    shared GPU its decoder still waits for them, and a baseline job runs with the GPU to itself."""
    backend = ServingBackend(ONE_GPU, ports=default_allocator(), launcher=[sys.executable, STUB])
    cell = _cell(tmp_path)
    try:
        with backend.pd(cell, gpus=(0,), cell_dir=tmp_path, prefill_key="k") as endpoints:
            assert endpoints.pd_url is not None
        with backend.baseline(cell, gpus=(0,), cell_dir=tmp_path) as endpoints:
            (baseline,) = endpoints.started.servers
            assert "--gpu-memory-utilization" not in baseline.argv
    finally:
        backend.close()
    assert starts == [
        ("prefill-0", set()),
        ("decode-0", {"prefill-0"}),
        ("baseline-0", set()),
    ]
    assert wait_gone(recorded_pids(tmp_path / "pids")) == []
