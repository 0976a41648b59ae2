"""Run the race harness as part of a sweep: `pdcheck race --out FILE` in a subprocess of the arm's python.

A subprocess, not an import: the sweep layer never imports vLLM, and the harness must run in
the python whose vLLM is under test. Its exit code is the verdict (0 clean, 1 findings, 2 the
harness could not run); its JSON is kept as evidence.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import time
from pathlib import Path
from typing import Any

from pdcheck.analysis.verdict import Status
from pdcheck.config.schema import RaceSettings
from pdcheck.results.schema import RaceOutcome

_STATUS = {0: Status.PASS, 1: Status.FAIL}
# How much nicer than the sweep the harness runs beside its servers: a CPU weight about a tenth.
BACKGROUND_NICE = 10


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
    return [*argv, "--out", str(json_path)]


class RaceRun:
    """The harness in the background: started before the sweep's first server, at a lower CPU
    priority, so it takes the CPU the servers leave idle (a core to spare, or the gaps while
    evals wait on servers) instead of slowing their start; `outcome()` waits for it. Its result
    does not depend on timing: it drives the scheduler in-process, step by step. A context
    manager: leaving the block early (an error, Ctrl-C) stops a harness that is still running."""

    def __init__(
        self,
        settings: RaceSettings,
        *,
        python: str,
        out_dir: Path,
        timeout_s: float = 1800.0,
        environment: str | None = None,
    ) -> None:
        # The `environments:` entry whose vLLM this harness drives (None: pdcheck's own).
        self.environment = environment
        self.json_path = out_dir / "race.json"
        self.log_path = out_dir / "race.log"
        self.argv = race_argv(settings, python=python, json_path=self.json_path)
        self.timeout_s = timeout_s
        self._proc: subprocess.Popen[bytes] | None = None
        self._started = 0.0

    def __enter__(self) -> RaceRun:
        with open(self.log_path, "w", encoding="utf-8") as log:
            self._proc = subprocess.Popen(self.argv, stdout=log, stderr=subprocess.STDOUT)
        self._started = time.monotonic()
        # Before the interpreter starts its threads, which inherit the main thread's priority.
        with contextlib.suppress(OSError):
            niceness = min(19, os.getpriority(os.PRIO_PROCESS, 0) + BACKGROUND_NICE)
            os.setpriority(os.PRIO_PROCESS, self._proc.pid, niceness)
        return self

    def __exit__(self, *exc_info: object) -> None:
        if self._proc is not None and self._proc.poll() is None:
            self._proc.kill()
            self._proc.wait()

    def outcome(self) -> RaceOutcome:
        """Wait for the harness (up to its timeout from the start); its verdict and evidence."""
        assert self._proc is not None, "outcome() outside the with block"
        try:
            code: int | None = self._proc.wait(
                max(0.0, self.timeout_s - (time.monotonic() - self._started))
            )
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()
            code = None
        return _outcome(self, code, duration_s=time.monotonic() - self._started)


def run_race_subprocess(
    settings: RaceSettings, *, python: str, out_dir: Path, timeout_s: float = 1800.0
) -> RaceOutcome:
    """The harness's outcome as the race summary: status pass/fail/infra, reason, exit code, its JSON."""
    with RaceRun(settings, python=python, out_dir=out_dir, timeout_s=timeout_s) as race:
        return race.outcome()


def _outcome(race: RaceRun, code: int | None, *, duration_s: float) -> RaceOutcome:
    json_path, log_path = race.json_path, race.log_path
    result = json.loads(json_path.read_text()) if json_path.is_file() else None
    status = _STATUS.get(code, Status.INFRA) if code is not None else Status.INFRA
    if code is None:
        reason = f"the harness did not finish within {race.timeout_s:g} s (log: {log_path})"
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
        argv=tuple(race.argv),
        duration_s=round(duration_s, 2),
        result=result,
        environment=race.environment,
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
