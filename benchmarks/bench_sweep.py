"""Speed bar of the sweep engine: server reuse vs restart-per-unit, side by side in one run.

On CPU with the tiny models, a 2-model × 4-concurrency matrix (one arm) runs twice through the
same engine: as built (each distinct server configuration started once, every concurrency level
run against it) and with reuse and caching off (servers restarted for every unit, like vLLM's
config_sweep_accuracy_test.sh). Prints both server-start counts against the number of distinct
server configurations, the busy time of each way and their ratio, then one JSON line.

The machine's heavy-run lock is taken around each topology only (never for the whole run), so
the busy time counts servers up and evals running, not waits for the lock.

    .venv/bin/python benchmarks/bench_sweep.py            # full matrix (about 25 min busy on 2 cores)
    .venv/bin/python benchmarks/bench_sweep.py --models 1 --concurrency 1 8
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import tempfile
import time
from pathlib import Path

from pdcheck.config import expand_cells, parse_sweep
from pdcheck.results.schema import SweepInfo
from pdcheck.results.store import Provenance, create_run
from pdcheck.sweep.engine import Engine, SweepOptions
from pdcheck.sweep.plan import distinct_server_configs
from pdcheck.sweep.serving_backend import ServingBackend

HEAVY_LOCK = "/tmp/pdcheck-heavy.lock"
MODELS = [
    ("tiny-llama", "tiny-llama-random", "full-attention"),
    ("tiny-granite", "tiny-granite-random", "hybrid"),
]


class LockedBackend:
    """ServingBackend that holds the heavy-run lock while a topology is up and times it."""

    def __init__(self, inner: ServingBackend):
        self.inner = inner
        self.busy_s = 0.0
        self.gpu_indices = inner.gpu_indices

    def provenance(self, cell):
        return self.inner.provenance(cell)

    @contextlib.contextmanager
    def _held(self, cm):
        # A blocking flock, like flock(1) used by everyone else: a polling lock would starve.
        with open(HEAVY_LOCK, "a") as lock_file:
            fcntl.flock(lock_file, fcntl.LOCK_EX)
            start = time.monotonic()
            try:
                with cm as value:
                    yield value
            finally:
                self.busy_s += time.monotonic() - start
                fcntl.flock(lock_file, fcntl.LOCK_UN)

    def baseline(self, cell, *, gpus, cell_dir):
        return self._held(self.inner.baseline(cell, gpus=gpus, cell_dir=cell_dir))

    def pd(self, cell, *, gpus, cell_dir, prefill_key=None):
        return self._held(
            self.inner.pd(cell, gpus=gpus, cell_dir=cell_dir, prefill_key=prefill_key)
        )

    def close(self):
        self.inner.close()


def sweep_spec(models: int, concurrency: list[int], limit: int) -> dict:
    return {
        "name": "bench-sweep",
        "models": [
            {
                "name": n,
                "path": f"fixture:{p}",
                "kind": k,
                "serve_args": ["--max-model-len", "2048", "--no-enable-prefix-caching"],
            }
            for n, p, k in MODELS[:models]
        ],
        "matrix": {"concurrency": concurrency},
        "eval": {"task": "gsm8k-synth", "limit": limit, "max_tokens": 16},
        "connector": {"kv_buffer_device": "cpu"},
        "serving": {"platform": "cpu", "ready_timeout_s": 300},
    }


def run_once(cells, root: Path, *, reuse: bool) -> dict:
    backend = LockedBackend(ServingBackend.for_cells(cells))
    store = create_run(
        root,
        provenance=Provenance(),
        sweep=SweepInfo(name="bench-sweep", file="bench-sweep.yaml", sha256="-"),
        environment={},
    )
    start = time.monotonic()
    result = Engine(cells, store=store, backend=backend, options=SweepOptions(reuse=reuse)).run()
    return {
        "wall_s": round(time.monotonic() - start, 1),
        "busy_s": round(backend.busy_s, 1),
        "server_starts": result.server_starts,
        "exit_code": int(result.exit_code),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", type=int, default=2, choices=(1, 2))
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 2, 4, 8])
    parser.add_argument(
        "--limit", type=int, default=8, help="questions per unit (small: starts dominate)"
    )
    args = parser.parse_args()
    cells = expand_cells(parse_sweep(sweep_spec(args.models, args.concurrency, args.limit)))
    distinct = distinct_server_configs(cells)
    with tempfile.TemporaryDirectory(prefix="bench-sweep-") as tmp:
        built = run_once(cells, Path(tmp) / "built", reuse=True)
        restart = run_once(cells, Path(tmp) / "restart", reuse=False)
    units = sum(2 * len(c.concurrency) for c in cells)
    ratio = restart["busy_s"] / built["busy_s"] if built["busy_s"] else float("nan")
    print(
        f"matrix: {len(cells)} cells × {len(args.concurrency)} concurrency levels = {units} units, "
        f"{distinct} distinct server configs"
    )
    print(
        f"engine as built:  {built['server_starts']:3d} server starts, busy {built['busy_s']:7.1f} s"
    )
    print(
        f"restart per unit: {restart['server_starts']:3d} server starts, busy {restart['busy_s']:7.1f} s"
    )
    print(
        f"ratio (restart / built busy time): {ratio:.2f}x; starts == distinct configs: "
        f"{built['server_starts'] == distinct}"
    )
    print(
        json.dumps(
            {
                "bench": "sweep",
                "cells": len(cells),
                "units": units,
                "distinct_server_configs": distinct,
                "built": built,
                "restart_per_unit": restart,
                "ratio": round(ratio, 2),
            }
        )
    )


if __name__ == "__main__":
    main()
