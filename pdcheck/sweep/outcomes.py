"""What a verdict means for a cell (the canary logic), and the sweep's exit code.

A canary arm (injected faults, fixes off) exists to prove that the suite can see the race.
So for a canary, REGRESSION or SUSPECT is the expected result and counts as a pass; a canary
that comes out PASS (or INCONCLUSIVE) is a failure: the suite lost its detection power.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from typing import Any, Literal

from pdcheck.errors import ExitCode

# The analysis layer's Verdict values, as the store writes them.
PASS, REGRESSION, SUSPECT, INCONCLUSIVE, INFRA_ERROR = (
    "PASS",
    "REGRESSION",
    "SUSPECT",
    "INCONCLUSIVE",
    "INFRA-ERROR",
)
FLAGGED = (REGRESSION, SUSPECT)

Status = Literal["pass", "fail", "infra", "inconclusive"]


@dataclass(frozen=True)
class Outcome:
    """A verdict judged against what the arm expects: `status` drives junit and the exit code."""

    status: Status
    verdict: str
    canary: bool
    reason: str

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def judge(verdict: str, reason: str, *, canary: bool) -> Outcome:
    if verdict == INFRA_ERROR:
        return Outcome("infra", verdict, canary, reason)
    if canary:
        if verdict in FLAGGED:
            return Outcome("pass", verdict, canary, f"canary flagged as expected: {reason}")
        return Outcome(
            "fail",
            verdict,
            canary,
            f"canary NOT flagged ({verdict}): the suite lost its detection power; {reason}",
        )
    if verdict in FLAGGED:
        return Outcome("fail", verdict, canary, reason)
    if verdict == INCONCLUSIVE:
        return Outcome("inconclusive", verdict, canary, reason)
    return Outcome("pass", verdict, canary, reason)


def exit_code(statuses: Iterable[str]) -> ExitCode:
    """1 beats 2: a real failure is the more important news; 2 when only infra went wrong."""
    seen = set(statuses)
    if "fail" in seen:
        return ExitCode.FAILED
    if "infra" in seen:
        return ExitCode.INFRA
    return ExitCode.OK


def count(statuses: Iterable[str]) -> dict[str, int]:
    return dict(sorted(Counter(statuses).items()))
