"""Evidence for a failing cell: the first diverging questions, server log tails, the rerun command.

All of it is read from the cell's folder in the store; nothing is recomputed from servers.
"""

from __future__ import annotations

import shlex
from collections import deque
from dataclasses import dataclass
from pathlib import Path

from pdcheck.analysis.agreement import first_divergence
from pdcheck.evals.records import QuestionRecord
from pdcheck.sweep.store import CellResult, RunResults

__all__ = ["DivergentQuestion", "LogTail", "diverging_questions", "log_tails", "rerun_command"]

# Which server logs matter most when a PD cell fails: the decoder loads the KV.
_LOG_ORDER = ("decode", "prefill", "proxy", "baseline")
# vLLM logs its whole config on one line of several thousand characters; a tail shows the start.
_LOG_LINE_CHARS = 240


@dataclass(frozen=True)
class DivergentQuestion:
    """A question whose PD output differs from its baseline output, at the first differing token."""

    index: int
    baseline_text: str
    pd_text: str
    baseline_correct: bool
    pd_correct: bool
    token_position: int  # in tokens, or characters when a side recorded only text
    baseline_token: str | None
    pd_token: str | None
    margin_nats: float | None  # the baseline's top-2 logprob margin there: small means a near tie
    grade: str  # tie, corruption or unclassified (analysis.agreement)


@dataclass(frozen=True)
class LogTail:
    path: str  # relative to the run folder, so links work inside the results artifact
    lines: tuple[str, ...]


def _divergence(baseline: QuestionRecord, pd: QuestionRecord, *, tie_epsilon_nats: float) -> DivergentQuestion | None:
    found = first_divergence(baseline, pd, tie_epsilon_nats=tie_epsilon_nats)
    if found is None:
        return None

    def token_at(record: QuestionRecord) -> str | None:
        if record.logprobs is None or found.position >= len(record.logprobs):
            return None
        return record.logprobs[found.position].token

    return DivergentQuestion(
        index=baseline.index,
        baseline_text=baseline.completion or "",
        pd_text=pd.completion or "",
        baseline_correct=baseline.correct,
        pd_correct=pd.correct,
        token_position=found.position,
        baseline_token=token_at(baseline),
        pd_token=token_at(pd),
        margin_nats=found.margin_nats,
        grade=found.grade,
    )


def diverging_questions(cell: CellResult, concurrency: int, *, tie_epsilon_nats: float,
                        limit: int = 3) -> list[DivergentQuestion]:
    """The first `limit` diverging questions of repeat 0: those PD got wrong and the baseline right first."""
    baseline_unit, pd_unit = cell.unit("baseline", concurrency, 0), cell.unit("pd", concurrency, 0)
    if baseline_unit is None or pd_unit is None:
        return []
    baseline = {r.index: r for r in baseline_unit.records() if r.ok}
    found = []
    for record in pd_unit.records():
        if record.ok and record.index in baseline:
            divergence = _divergence(baseline[record.index], record, tie_epsilon_nats=tie_epsilon_nats)
            if divergence is not None:
                found.append(divergence)
    found.sort(key=lambda d: (not (d.baseline_correct and not d.pd_correct), d.index))
    return found[:limit]


def log_tails(run: RunResults, cell: CellResult, *, lines: int = 12, max_files: int = 3) -> list[LogTail]:
    """The last lines of the cell's server logs, decoder first."""
    logs_dir = run.info.root / "cells" / cell.dirname / "logs"
    files = sorted(logs_dir.glob("*.log")) if logs_dir.is_dir() else []

    def rank(path: Path) -> tuple[int, str]:
        hits = [i for i, role in enumerate(_LOG_ORDER) if role in path.name]
        return (hits[0] if hits else len(_LOG_ORDER), path.name)

    tails = []
    for path in sorted(files, key=rank)[:max_files]:
        with open(path, encoding="utf-8", errors="replace") as f:
            tail = tuple(_clip(line.rstrip("\n")) for line in deque(f, maxlen=lines))
        tails.append(LogTail(str(path.relative_to(run.info.root)), tail))
    return tails


def _clip(line: str) -> str:
    return line if len(line) <= _LOG_LINE_CHARS else line[: _LOG_LINE_CHARS - 1] + "…"


def rerun_command(run: RunResults, cell: CellResult) -> str:
    """The exact command that reruns this one cell from its sweep file."""
    sweep_file = run.info.sweep.get("file") or "SWEEP.yaml"
    return shlex.join(["pdcheck", "sweep", str(sweep_file), "--only", cell.name])
