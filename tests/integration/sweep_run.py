"""Run `pdcheck sweep` as a user does, for the end-to-end tests: a child process, exit code 0."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path


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
