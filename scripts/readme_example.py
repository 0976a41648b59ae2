"""Rewrite the README's example report from a real run, so that it cannot go stale.

    python scripts/readme_example.py pdcheck-results/cpu-smoke-<time>   # after `make sweep`
    python scripts/readme_example.py                                    # re-render the stored run

Given a results folder, it first stores the files the excerpt is rendered from under
`docs/example-run/<run>/` (the JSON the report reads, without records, logs and the plugin's
markers), replacing the run stored before. Then, and alone when no folder is given, it renders
the excerpt from that stored run (the report's overall line and results table, as
`pdcheck report` draws them today) and writes it between the README's markers. The opening
marker names the run and the sha256 of its summary.json; `tests/unit/report/test_readme_example.py`
checks that the README's block is exactly what this script renders from the stored run.
"""

from __future__ import annotations

import argparse
import hashlib
import re
import shutil
import sys
from pathlib import Path

from pdcheck.report.rows import build_rows
from pdcheck.report.sections import overall_line, results_table
from pdcheck.results.load import RunResults, load_run
from pdcheck.results.summary import run_summary

REPO = Path(__file__).resolve().parent.parent
README = REPO / "README.md"
STORED_RUNS = REPO / "docs" / "example-run"
BEGIN = "<!-- readme-example: begin"
END = "<!-- readme-example: end -->"
# What the report reads of a run: its JSON files, except the plugin's markers and the race's full output.
_SKIPPED_DIRS = {"logs", "plugin"}
_SKIPPED_FILES = {"race.json"}


def store_run(run_dir: Path, runs: Path = STORED_RUNS) -> Path:
    """Copy the JSON files of `run_dir` that the excerpt is rendered from to `runs/<name>/`, alone."""
    if not (run_dir / "summary.json").is_file():
        raise SystemExit(
            f"{run_dir}: no summary.json; give a finished `pdcheck sweep` results folder"
        )
    if runs.resolve() in run_dir.resolve().parents:
        raise SystemExit(f"{run_dir} is the stored run; run without a folder to re-render it")
    for old in runs.glob("*/summary.json"):
        shutil.rmtree(old.parent)
    dest = runs / run_dir.resolve().name
    for path in sorted(run_dir.rglob("*.json")):
        relative = path.relative_to(run_dir)
        if _SKIPPED_DIRS.intersection(relative.parts[:-1]) or path.name in _SKIPPED_FILES:
            continue
        (dest / relative).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, dest / relative)
    return dest


def stored_run(runs: Path = STORED_RUNS) -> Path:
    """The one run stored under `runs`."""
    found = sorted(p.parent for p in runs.glob("*/summary.json"))
    if len(found) != 1:
        raise SystemExit(
            f"{runs}: expected one stored run, found {len(found)}; give a results folder"
        )
    return found[0]


def summary_sha256(run_dir: Path) -> str:
    return hashlib.sha256((run_dir / "summary.json").read_bytes()).hexdigest()


def _caption(run: RunResults) -> str:
    vllm = run.info.environment.get("vllm") or {}
    specs = [c.spec for c in run.cells if c.spec is not None]
    models = list(dict.fromkeys(s.model.name for s in specs))
    limits = sorted({s.eval.limit for s in specs if s.eval.limit is not None})
    tasks = sorted({s.eval.task for s in specs})
    early = any(s.analysis.early_stop for s in specs)
    questions = (
        f"{'/'.join(map(str, limits))} {'/'.join(tasks)} questions per level"
        if limits
        else f"every {'/'.join(tasks)} question"
    )
    return (
        f"The `{run.info.sweep.name}` sweep on {vllm.get('vllm_dist') or 'vLLM'} "
        f"{vllm.get('vllm_version') or '(version unknown)'} with pdcheck {run.info.provenance.pdcheck_version}, "
        f"started {run.info.file.started}: {len(run.cells)} cells over {', '.join(models)}, "
        f"{questions}, early stop {'on' if early else 'off'}."
    )


def render_block(run_dir: Path) -> str:
    """The README's example block, markers included, rendered from the stored run `run_dir`."""
    run = load_run(run_dir)
    rows = build_rows(run)
    return "\n\n".join(
        [
            f"{BEGIN} run {run_dir.name}, summary.json sha256 {summary_sha256(run_dir)}; "
            "written by scripts/readme_example.py, do not edit -->",
            _caption(run),
            overall_line(run_summary(run), rows),
            results_table(rows),
            END,
        ]
    )


def readme_block(text: str) -> str:
    """The README's example block, markers included; SystemExit unless there is exactly one."""
    found = re.findall(rf"^{re.escape(BEGIN)}.*?^{re.escape(END)}$", text, flags=re.M | re.S)
    if len(found) != 1 or text.count(BEGIN) != 1 or text.count(END) != 1:
        raise SystemExit(f"README.md must hold one `{BEGIN} ... -->` ... `{END}` block")
    return found[0]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("run_dir", nargs="?", type=Path, help="a finished results folder")
    args = parser.parse_args(argv)
    run_dir = store_run(args.run_dir) if args.run_dir is not None else stored_run()
    text = README.read_text()
    README.write_text(text.replace(readme_block(text), render_block(run_dir)))
    print(f"README.md: example report from {run_dir.relative_to(REPO)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
