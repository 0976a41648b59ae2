"""Evidence for a failing cell: the first diverging questions, server log tails, the rerun command.

All of it is read from the cell's folder in the store; nothing is recomputed from servers.
"""

from __future__ import annotations

import shlex
from collections import deque
from dataclasses import dataclass
from pathlib import Path

from pdcheck.analysis.agreement import CORRUPTION, TIE, UNCLASSIFIED
from pdcheck.evals.records import QuestionRecord, read_records
from pdcheck.results.load import CellResult, RunResults

__all__ = [
    "DivergentQuestion",
    "LogTail",
    "diverging_questions",
    "log_tails",
    "read_questions",
    "rerun_command",
]

# Which server logs matter most when a PD cell fails: the decoder loads the KV.
_LOG_ORDER = ("decode", "prefill", "proxy", "baseline")
# Confident flips are the strongest evidence of corruption; near-tie flips the weakest.
_GRADE_ORDER = {CORRUPTION: 0, UNCLASSIFIED: 1, TIE: 2}
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


def read_questions(path: Path, wanted: set[int]) -> dict[int, QuestionRecord]:
    """Only the wanted questions of a records file (others are skipped unparsed)."""
    if not path.is_file():
        return {}
    return {record.index: record for record in read_records(path, indices=wanted)}


def _token(record: QuestionRecord, position: int) -> str | None:
    if record.logprobs is None or position >= len(record.logprobs):
        return None
    return record.logprobs[position].token


def diverging_questions(
    cell: CellResult, concurrency: int, *, candidates: int = 20, limit: int = 3
) -> list[DivergentQuestion]:
    """Up to `limit` diverging questions of repeat 0, from the divergences the analysis stored.

    The first `candidates` divergences (corruption-grade first, then by index) are read; of
    those, questions the baseline got right and PD wrong come first.
    """
    entry = cell.verdicts.get(concurrency)
    baseline_unit, pd_unit = cell.unit("baseline", concurrency, 0), cell.unit("pd", concurrency, 0)
    if entry is None or entry.comparison is None or baseline_unit is None or pd_unit is None:
        return []
    divergences = entry.comparison.agreement.divergences
    ranked = sorted(
        divergences, key=lambda d: (_GRADE_ORDER.get(d.grade, len(_GRADE_ORDER)), d.index)
    )[:candidates]
    wanted = {d.index for d in ranked}
    baseline = read_questions(baseline_unit.records_path, wanted)
    pd = read_questions(pd_unit.records_path, wanted)
    found = [
        DivergentQuestion(
            index=d.index,
            baseline_text=baseline[d.index].completion or "",
            pd_text=pd[d.index].completion or "",
            baseline_correct=baseline[d.index].correct,
            pd_correct=pd[d.index].correct,
            token_position=d.position,
            baseline_token=_token(baseline[d.index], d.position),
            pd_token=_token(pd[d.index], d.position),
            margin_nats=d.margin_nats,
            grade=d.grade,
        )
        for d in ranked
        if d.index in baseline and d.index in pd
    ]
    found.sort(
        key=lambda q: not (q.baseline_correct and not q.pd_correct)
    )  # stable: keeps the ranking
    return found[:limit]


def log_tails(
    run: RunResults, cell: CellResult, *, lines: int = 12, max_files: int = 3
) -> list[LogTail]:
    """The last lines of the cell's server logs, decoder first."""
    files = run.log_files(cell)

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
    sweep_file = run.info.sweep.file or "SWEEP.yaml"
    return shlex.join(["pdcheck", "sweep", str(sweep_file), "--only", cell.name])
