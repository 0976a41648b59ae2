"""Run the race harness as part of a sweep: `pdcheck race --json` in a subprocess of the arm's python.

A subprocess, not an import: the sweep layer never imports vLLM, and the harness must run in
the python whose vLLM is under test. Its exit code is the verdict (0 clean, 1 findings, 2 the
harness could not run); its JSON is kept as evidence.
"""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path
from typing import Any

from pdcheck.analysis.verdict import Status
from pdcheck.config.schema import RaceSettings
from pdcheck.sweep.schema import RaceOutcome

_STATUS = {0: Status.PASS, 1: Status.FAIL}


def race_argv(settings: RaceSettings, *, python: str, json_path: Path) -> list[str]:
    argv = [
        python,
        "-m",
        "pdcheck",
        "race",
        "--seeds",
        str(settings.seeds),
        "--requests",
        str(settings.requests),
    ]
    for variant in settings.variants:
        argv += ["--variant", variant]
    return [*argv, "--json", str(json_path)]


def run_race_subprocess(
    settings: RaceSettings, *, python: str, out_dir: Path, timeout_s: float = 1800.0
) -> RaceOutcome:
    """The harness's outcome as the race summary: status pass/fail/infra, reason, exit code, its JSON."""
    json_path = out_dir / "race.json"
    log_path = out_dir / "race.log"
    argv = race_argv(settings, python=python, json_path=json_path)
    start = time.monotonic()
    try:
        with open(log_path, "w", encoding="utf-8") as log:
            proc = subprocess.run(
                argv, stdout=log, stderr=subprocess.STDOUT, timeout=timeout_s, check=False
            )
        code: int | None = proc.returncode
    except subprocess.TimeoutExpired:
        code = None
    result = json.loads(json_path.read_text()) if json_path.is_file() else None
    status = _STATUS.get(code, Status.INFRA) if code is not None else Status.INFRA
    if code is None:
        reason = f"the harness did not finish within {timeout_s:g} s (log: {log_path})"
    elif status is Status.PASS:
        reason = "no findings"
    elif status is Status.FAIL:
        reason = _findings_line(result)
    else:
        tail = (
            log_path.read_text(errors="replace").strip().splitlines()[-1:]
            if log_path.is_file()
            else []
        )
        reason = f"the harness could not run (exit {code}): {tail[0] if tail else 'no output'} (log: {log_path})"
    return RaceOutcome(
        status=status,
        reason=reason,
        exit_code=code,
        argv=tuple(argv),
        duration_s=round(time.monotonic() - start, 2),
        result=result,
    )


def _findings_line(result: dict[str, Any] | None) -> str:
    if not result:
        return "findings reported (no JSON written)"
    parts = [
        f"{v['variant']}: {v['seeds_with_findings']}/{v['seeds']} seeds"
        for v in result.get("variants", [])
        if v.get("seeds_with_findings")
    ]
    return "findings in " + ("; ".join(parts) or "the harness") + " (see race/race.json)"
