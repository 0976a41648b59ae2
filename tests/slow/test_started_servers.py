"""cell.json records the servers that ran, and a job plans only the servers it starts.

Stand-in servers (tests/fakes/stub_server.py) replace vLLM: the sweep engine runs one cell on
the real `ServingBackend`, and while each topology serves, every process named in cell.json
is compared with the live process (`/proc/<pid>/cmdline` and `environ`) and its URL.
"""

from __future__ import annotations

import json
import sys
import urllib.request
from pathlib import Path

import msgspec
import pytest

from pdcheck.config.cells import SIDE_ROLES
from pdcheck.results.schema import SweepInfo
from pdcheck.results.store import Provenance, create_run
from pdcheck.serving import TopologyRecord
from pdcheck.serving.gpus import Gpu, GpuInventory
from pdcheck.serving.ports import PortAllocator, default_allocator
from pdcheck.sweep.engine import Engine
from pdcheck.sweep.serving_backend import ServingBackend
from tests.fakes.stub_topology import STUB, recorded_pids, wait_gone
from tests.unit.serving.conftest import make_cell


def live_argv(pid: int) -> list[str]:
    return Path(f"/proc/{pid}/cmdline").read_bytes().rstrip(b"\0").decode().split("\0")


def live_env(pid: int) -> dict[str, str]:
    pairs = Path(f"/proc/{pid}/environ").read_bytes().rstrip(b"\0").decode().split("\0")
    return dict(p.split("=", 1) for p in pairs if "=" in p)


def healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=5) as resp:
            return resp.status == 200
    except OSError:
        return False


def check_live(server: dict) -> list[str]:
    """What differs between one cell.json server entry and the process running now."""
    problems = []
    argv = live_argv(server["pid"])
    if argv != server["argv"]:
        problems.append(f"{server['name']}: argv {server['argv']} but the process runs {argv}")
    env = live_env(server["pid"])
    problems += [
        f"{server['name']}: env {k}={v!r} but the process has {env.get(k)!r}"
        for k, v in server["env"].items()
        if env.get(k) != v
    ]
    port = argv[argv.index("--port") + 1]
    if not server["url"].endswith(f":{port}") or server["ports"]["http"] != int(port):
        problems.append(f"{server['name']}: url {server['url']} but the process serves :{port}")
    if not healthy(server["url"]):
        problems.append(f"{server['name']}: nothing healthy at {server['url']}")
    return problems


class LiveCheck:
    """An engine event sink: while each started topology serves (at its first question), what
    differs between its cell.json entry and the live processes, by the roles it started."""

    def __init__(self, cell_json: Path):
        self.cell_json = cell_json
        self.problems: dict[str, list[str]] = {}

    def __call__(self, event) -> None:
        if event.kind != "record":
            return
        # On CPU a cell's baseline and PD topologies may be up at once: check each when first seen.
        for started in json.loads(self.cell_json.read_text())["servers"]:
            roles = "+".join(s["role"] for s in started["servers"])
            if roles not in self.problems:
                self.problems[roles] = [p for s in started["servers"] for p in check_live(s)]


@pytest.fixture
def pid_dir(tmp_path):
    (tmp_path / "pids").mkdir()
    return tmp_path / "pids"


def test_cell_json_names_the_processes_that_served_each_job(tmp_path, pid_dir):
    """While the baseline and the PD topology serve, cell.json lists each process with the argv,
    env, URL and port it runs with (what main wrote was a second plan with fresh ports)."""
    cell = make_cell(
        matrix={"concurrency": [1], "env": [{"STUB_PID_DIR": str(pid_dir)}]},
        eval={"task": "gsm8k-synth", "limit": 2, "max_tokens": 4},
        serving={"platform": "cpu", "ready_timeout_s": 30},
    )
    store = create_run(
        tmp_path / "run",
        provenance=Provenance(),
        sweep=SweepInfo(name="unit", file="unit.yaml", sha256="x"),
        environment={},
    )
    cell_json = store.root / "cells" / cell.dirname / "cell.json"
    backend = ServingBackend(
        GpuInventory((), "none"),
        ports=default_allocator(),
        launcher=[sys.executable, STUB],
    )
    live = LiveCheck(cell_json)
    Engine([cell], store=store, backend=backend, on_event=live).execute()
    assert live.problems == {"baseline": [], "prefill+decode": []}
    records = msgspec.convert(json.loads(cell_json.read_text())["servers"], list[TopologyRecord])
    # On CPU the baseline and the PD topology start together, so either may be recorded first.
    assert sorted(r.proxy_url is not None for r in records) == [False, True]
    assert wait_gone(recorded_pids(pid_dir)) == []


def test_a_job_plans_its_own_servers_on_its_own_gpus(tmp_path):
    """A job's plan holds the servers of its side alone, each on the placement's GPUs in order;
    a PD job's proxy port is planned, a baseline job's is not."""
    inventory = GpuInventory(tuple(Gpu(i, "sim") for i in range(6)), "nvidia-smi")
    backend = ServingBackend(inventory, ports=PortAllocator(bucket=7))
    cell = make_cell(matrix={"prefill_tp": [2], "decode_tp": [1]}, serving={"platform": "gpu"})
    pd = backend.plan(cell, roles=SIDE_ROLES["pd"], gpus=(3, 4, 5), cell_dir=tmp_path)
    assert [(s.name, s.gpus) for s in pd.servers] == [
        ("prefill-0", ("3", "4")),
        ("decode-0", ("5",)),
    ]
    assert pd.proxy_port is not None and pd.baseline is None
    base = backend.plan(cell, roles=SIDE_ROLES["baseline"], gpus=(1,), cell_dir=tmp_path)
    assert [(s.name, s.env["CUDA_VISIBLE_DEVICES"]) for s in base.servers] == [("baseline-0", "1")]
    assert base.proxy_port is None
