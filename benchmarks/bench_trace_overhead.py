"""Speed bar for the trace recorder: scheduler step time with recording vs without, bar < 5% added.

Usage: .venv/bin/python benchmarks/bench_trace_overhead.py [--seeds N] [--variant NAME]
Drives vLLM's real scheduler through the race harness (a CPU run with no model) and times only the
scheduler calls (schedule + update_from_output, including the recorder's hooks) in CPU time, alternating
recorded and unrecorded seeds so machine load hits both sides alike. Not collected by pytest.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seeds", type=int, default=6)
    parser.add_argument("--requests", type=int, default=300)
    parser.add_argument("--variant", default="hybrid-align")
    args = parser.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")

    from pdcheck._vllm import scheduler as adapter
    from pdcheck.race.run import prepare_vllm

    prepare_vllm()
    from pdcheck.race.run import run_seed
    from pdcheck.race.workload import get_variant
    from pdcheck.vllm_plugin.trace_recorder import recording

    spent = {"off": 0.0, "on": 0.0}
    side = ["off"]
    original = {name: getattr(adapter.SimScheduler, name) for name in ("schedule", "update")}

    def timed(name):
        def wrapper(self, *a, **k):
            t = time.process_time()  # CPU time: other processes' load does not count
            try:
                return original[name](self, *a, **k)
            finally:
                spent[side[0]] += time.process_time() - t

        return wrapper

    for name in original:
        setattr(adapter.SimScheduler, name, timed(name))
    workload = get_variant(args.variant).with_overrides(requests=args.requests)
    run_seed(workload, 10_000)  # warm-up
    steps = 0
    ratios = []
    with tempfile.TemporaryDirectory() as tmp:
        for seed in range(args.seeds):
            per_mode = {}
            for mode in ("off", "on") if seed % 2 == 0 else ("on", "off"):
                side[0] = mode
                before = spent[mode]
                if mode == "on":
                    with recording(os.path.join(tmp, str(seed))):
                        steps += run_seed(workload, seed).steps
                else:
                    run_seed(workload, seed)
                per_mode[mode] = spent[mode] - before
            ratios.append(per_mode["on"] / per_mode["off"])
        trace_bytes = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(tmp) for f in fs)
    ratio = statistics.median(ratios)  # per seed, so a burst of load on one side moves one sample only
    print(f"scheduler time without recording {spent['off']:.3f} s, with {spent['on']:.3f} s; median per-seed ratio {ratio:.3f} "
          f"(added {100 * (ratio - 1):.1f}%, bar < 5%); {trace_bytes / steps:.0f} trace bytes per step")
    print(json.dumps({"bench": "trace_overhead", "variant": args.variant, "seeds": args.seeds, "off_s": round(spent["off"], 4),
                      "on_s": round(spent["on"], 4), "ratio": round(ratio, 4), "ratios": [round(r, 3) for r in ratios], "bytes_per_step": round(trace_bytes / steps)}))


if __name__ == "__main__":
    main()
