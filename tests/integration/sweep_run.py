"""Run `pdcheck sweep` as a user does, for the end-to-end tests: a child process, exit code 0."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterable
from pathlib import Path

import pytest
import yaml

from pdcheck.config.load import SWEEPS_DIR
from pdcheck.config.paths import fixture_models_dir


def trimmed_cpu_smoke(
    folder: Path,
    *,
    name: str,
    model: str | Iterable[str],
    arms: Iterable[str],
    concurrency: Iterable[int],
    questions: int,
    early_stop: bool,
    include: Iterable[dict[str, str]] = (),
) -> Path:
    """cpu-smoke cut to `model` (one name or several), `arms` at `concurrency` (the cells
    `include` selects, when given), `questions` questions, a 20-point margin and no race run
    (the harness has its own tests; here the serving path is under test), written to
    `<folder>/<name>.yaml`."""
    models = [model] if isinstance(model, str) else list(model)
    for each in models:
        if not (fixture_models_dir() / each / "config.json").is_file():
            pytest.fail(f"no {each}: run `pdcheck fixtures tiny-models` (make test does)")
    spec = yaml.safe_load((SWEEPS_DIR / "cpu-smoke.yaml").read_text())
    spec["name"] = name
    spec["models"] = [m for m in spec["models"] if m["name"] in models]
    for key in ("exclude", "race"):
        spec.pop(key, None)
    spec["matrix"] = {"arms": list(arms), "concurrency": list(concurrency)}
    if include:
        spec["include"] = list(include)
    spec["eval"] = dict(spec["eval"], limit=questions)
    # 40 questions resolve drops of roughly 20 points; the injected canaries drop far more.
    spec["analysis"] = {"margin_pts": 20, "early_stop": early_stop}
    path = folder / f"{name}.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def run_sweep(sweep_file: Path, out: Path) -> None:
    """`pdcheck sweep sweep_file --out out`; fails with every level's result unless it exits 0."""
    proc = subprocess.run(
        [sys.executable, "-m", "pdcheck", "sweep", str(sweep_file), "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=580,
        env=dict(os.environ, HF_HUB_OFFLINE="1"),
    )
    summary = json.loads((out / "summary.json").read_text())
    results = {
        f"{c['name']} c{r['concurrency']}": r for c in summary["cells"] for r in c["results"]
    }
    assert proc.returncode == 0, (
        f"exit {proc.returncode}: {json.dumps(results, indent=1)}\n{proc.stderr[-3000:]}"
    )
