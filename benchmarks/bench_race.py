"""Speed bar for the race harness: one seed of 300 requests < 1 s after `import vllm`; prints steps/s.

Usage: .venv/bin/python benchmarks/bench_race.py [--seeds N] [--requests N] [--variant NAME ...]
Measures import, scheduler build and simulation separately, in one run. Not collected by pytest.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--requests", type=int, default=300)
    parser.add_argument("--variant", action="append")
    args = parser.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")

    t0 = time.perf_counter()
    from pdcheck.race.run import prepare_vllm

    prepare_vllm()
    import_s = time.perf_counter() - t0

    from pdcheck.race.run import run_seed
    from pdcheck.race.workload import DEFAULT_VARIANTS, get_variant

    results = {}
    for name in args.variant or DEFAULT_VARIANTS:
        workload = get_variant(name).with_overrides(requests=args.requests)
        run_seed(workload, 10_000)  # warm-up: the first build of a layout inspects the model config
        per_seed = []
        steps = 0
        for seed in range(args.seeds):
            t = time.perf_counter()
            result = run_seed(workload, seed)
            per_seed.append(time.perf_counter() - t)
            steps += result.steps
        results[name] = {
            "seed_s_median": round(statistics.median(per_seed), 3),
            "seed_s_max": round(max(per_seed), 3),
            "steps_per_seed": steps / args.seeds,
            "steps_per_s": round(steps / sum(per_seed), 1),
        }
        print(
            f"{name:22s} median {results[name]['seed_s_median']:.3f} s/seed (bar 1 s: ratio {results[name]['seed_s_median']:.2f}), "
            f"{results[name]['steps_per_seed']:.0f} steps/seed, {results[name]['steps_per_s']:.0f} steps/s"
        )
    print(
        json.dumps(
            {
                "bench": "race",
                "import_s": round(import_s, 2),
                "requests": args.requests,
                "variants": results,
            }
        )
    )


if __name__ == "__main__":
    main()
