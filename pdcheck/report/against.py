"""Run-to-run comparison (`--against`): which results changed, and those first.

Results are matched by cell name and concurrency, not by cell id: the id hashes the whole
resolved config, so it changes with eval settings that the comparison should survive.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from pdcheck.report.rows import ResultRow

__all__ = ["Comparison", "compare_rows"]

# Accuracies are shown to 0.1 point; a difference below that is not a change anyone can see.
_ACCURACY_STEP_PTS = 0.1


@dataclass(frozen=True)
class Comparison:
    rows: tuple[ResultRow, ...]  # changed first, then unchanged, each in the new run's order
    before: dict[tuple[str, int], str]  # key -> what the old run said, for the "Before" column
    changed: frozenset[tuple[str, int]]
    removed: tuple[tuple[str, int], ...]  # results the old run had and the new one lacks


def _accuracy_changed(new: float | None, old: float | None) -> bool:
    if new is None or old is None:
        return (new is None) != (old is None)
    return abs(new - old) * 100 >= _ACCURACY_STEP_PTS


def _describe(row: ResultRow) -> str:
    accuracy = "–" if row.pd_accuracy is None else f"{100 * row.pd_accuracy:.1f}%"
    return f"{row.verdict}, PD {accuracy}"


def compare_rows(new: Sequence[ResultRow], old: Sequence[ResultRow]) -> Comparison:
    """Order `new` so that results whose verdict or PD accuracy changed (or that are new) come first."""
    old_by_key = {row.key: row for row in old}
    changed = set()
    for row in new:
        previous = old_by_key.get(row.key)
        if (
            previous is None
            or previous.verdict != row.verdict
            or _accuracy_changed(row.pd_accuracy, previous.pd_accuracy)
        ):
            changed.add(row.key)
    ordered = [r for r in new if r.key in changed] + [r for r in new if r.key not in changed]
    before = {}
    for row in new:
        previous = old_by_key.get(row.key)
        if previous is not None:
            before[row.key] = ("was " if row.key in changed else "same: ") + _describe(previous)
    new_keys = {r.key for r in new}
    removed = tuple(row.key for row in old if row.key not in new_keys)
    return Comparison(tuple(ordered), before, frozenset(changed), removed)
