"""Speed bar of `--backend ray` (issue 32): the same reduced CPU smoke sweep through the local
backend and through a three-node Ray cluster on this machine, side by side in one run.

The sweep is cpu-smoke's tiny Llama, its clean arm and the injected-zero canary, at the given
concurrency levels, 40 questions. The Ray run places prefill and decode on different nodes
(cross-node); the cluster (head with 1 CPU, two workers with 3, every listener on 127.0.0.1, no
dashboard) is started before and stopped after its run, and its start is timed apart. Prints
each run's wall time and verdicts, the ratio (the bar: at most 1.5), then one JSON line.

    flock /tmp/pdcheck-heavy.lock .venv/bin/python benchmarks/bench_ray.py --concurrency 1 8
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

from pdcheck.config.load import SWEEPS_DIR
from pdcheck.results import load_run

RAY_ENV = {"RAY_USAGE_STATS_ENABLED": "0", "HF_HUB_OFFLINE": "1"}
NODE_ARGS: dict[str, Any] = {
    "node_ip_address": "127.0.0.1",
    "object_store_memory": 80 * 1024 * 1024,
}


def sweep_file(folder: Path, concurrency: list[int]) -> Path:
    spec = yaml.safe_load((SWEEPS_DIR / "cpu-smoke.yaml").read_text())
    spec["name"] = "ray-bench"
    spec["models"] = [m for m in spec["models"] if m["name"] == "tiny-llama"]
    for key in ("exclude", "race"):
        spec.pop(key, None)
    spec["matrix"] = {"arms": ["fixes-on", "inject-zero"], "concurrency": concurrency}
    spec["eval"] = dict(spec["eval"], limit=40)
    path = folder / "ray-bench.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def run(file: Path, out: Path, *extra: str) -> tuple[float, int]:
    pdcheck = str(Path(sys.executable).with_name("pdcheck"))
    start = time.monotonic()
    with open(out.with_suffix(".log"), "wb") as log:
        rc = subprocess.run(
            [pdcheck, "sweep", str(file), "--out", str(out), *extra],
            env={**os.environ, **RAY_ENV},
            stdout=log,
            stderr=subprocess.STDOUT,
            check=False,
        ).returncode
    return time.monotonic() - start, rc


def verdicts(out: Path) -> dict[str, str]:
    return {
        f"{cell.name} c{c}": entry.verdict.verdict
        for cell in load_run(out).cells
        for c, entry in sorted(cell.verdicts.items())
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8])
    args = parser.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="bench-ray-"))
    file = sweep_file(folder, args.concurrency)
    local_s, local_rc = run(file, folder / "local")

    from ray.cluster_utils import Cluster

    os.environ.update(RAY_ENV)
    started = time.monotonic()
    cluster = Cluster(
        initialize_head=True,
        head_node_args={**NODE_ARGS, "num_cpus": 1, "include_dashboard": False},
    )
    try:
        for _ in range(2):
            cluster.add_node(**NODE_ARGS, num_cpus=3)
        cluster.wait_for_nodes()
        cluster_s = time.monotonic() - started
        ray_s, ray_rc = run(
            file, folder / "ray", "--backend", "ray", "--ray-address", cluster.address
        )
    finally:
        cluster.shutdown()
    local_v, ray_v = verdicts(folder / "local"), verdicts(folder / "ray")
    width = max(len(k) for k in [*local_v, "wall time (s)"])
    print(f"{'':{width}} {'local':>10} {'ray':>10}")
    print(f"{'wall time (s)':{width}} {local_s:10.1f} {ray_s:10.1f}")
    print(f"{'exit code':{width}} {local_rc:10d} {ray_rc:10d}")
    for key in local_v:
        print(f"{key:{width}} {local_v[key]:>10} {ray_v.get(key, '-'):>10}")
    print(f"ray / local: {ray_s / local_s:.2f} (bar: at most 1.5); cluster start {cluster_s:.1f} s")
    print(
        json.dumps(
            {
                "bench": "ray",
                "local_s": round(local_s, 1),
                "ray_s": round(ray_s, 1),
                "ratio": round(ray_s / local_s, 3),
                "cluster_start_s": round(cluster_s, 1),
                "verdicts_equal": local_v == ray_v,
                "folder": str(folder),
            }
        )
    )


if __name__ == "__main__":
    main()
