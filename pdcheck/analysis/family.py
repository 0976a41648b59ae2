"""The run's decision: Holm across its clean tests, so a clean sweep fails with probability ≤ alpha.

Every clean test (a clean cell at one concurrency level; its repeats pooled) gives a sequential
p-value (`design.py`). Holm's step-down procedure sorts them, p_(1) ≤ … ≤ p_(F), and rejects
p_(j) while p_(j) ≤ alpha / (F − j + 1). It controls the family-wise error at alpha under any
dependence between the tests, so the chance that a sweep with no drop anywhere flags anything
is at most alpha, however many cells and levels it has. The adjusted p-value is
max_{i ≤ j} min(1, (F − i + 1)·p_(i)); a test is rejected exactly when its adjusted p ≤ alpha.

A rejected test is a REGRESSION unless its last look showed the drop within the margin.

Canaries (injected faults, fixes off) are outside the family: they are expected to flag, and
counting them would spend the clean tests' alpha on tests meant to fail. Each canary is judged
on its own at alpha (adjusted p = its p).

Request errors can hide a drop: `worst_case_p` is the p-value with PD-only failed requests
counted as PD-wrong where the baseline was right. A test that Holm rejects with it but not
without it is `error_sensitive`: its verdict depends on what the failed requests would have
answered, and the run reports it INCONCLUSIVE.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["FamilyMember", "FamilyVerdict", "decide_alone", "decide_family", "holm_adjust"]


def holm_adjust(p_values: Sequence[float]) -> tuple[float, ...]:
    """Holm-adjusted p-values, in the input order."""
    f = len(p_values)
    order = sorted(range(f), key=lambda i: p_values[i])
    adjusted = [1.0] * f
    running = 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (f - rank) * p_values[i]))
        adjusted[i] = running
    return tuple(adjusted)


@dataclass(frozen=True)
class FamilyMember:
    """One test as the run sees it."""

    key: str  # e.g. "<cell id>@c8"
    p_value: float  # raw exact McNemar p at the last look
    sequential_p: float
    within_margin: bool
    canary: bool = False
    worst_case_p: float | None = None  # sequential p with PD-only errors scored as PD-wrong
    worst_case_within_margin: bool = False


@dataclass(frozen=True)
class FamilyVerdict:
    """The run-level decision for one test."""

    key: str
    p_value: float
    sequential_p: float
    adjusted_p: float
    family_size: int  # 1 for a canary
    flagged: bool  # REGRESSION
    error_sensitive: bool  # would be flagged with PD-only errors scored as wrong


def _flags(ps: Sequence[float], within: Sequence[bool], alpha: float) -> list[bool]:
    return [a <= alpha and not w for a, w in zip(holm_adjust(ps), within, strict=True)]


def decide_family(members: Sequence[FamilyMember], *, alpha: float) -> tuple[FamilyVerdict, ...]:
    """Holm over the clean members, each canary alone; results in the input order."""
    clean = [i for i, m in enumerate(members) if not m.canary]
    ps = [members[i].sequential_p for i in clean]
    within = [members[i].within_margin for i in clean]
    adjusted = dict(zip(clean, holm_adjust(ps), strict=True))
    flagged = dict(zip(clean, _flags(ps, within, alpha), strict=True))
    out = []
    for i, m in enumerate(members):
        if m.canary:
            adj, size = m.sequential_p, 1
            flag = adj <= alpha and not m.within_margin
        else:
            adj, size, flag = adjusted[i], len(clean), flagged[i]
        sensitive = False
        if not flag and m.worst_case_p is not None and m.worst_case_p < m.sequential_p:
            if m.canary:
                sensitive = m.worst_case_p <= alpha and not m.worst_case_within_margin
            else:
                worst = [m.worst_case_p if j == i else members[j].sequential_p for j in clean]
                worst_within = [
                    m.worst_case_within_margin if j == i else members[j].within_margin
                    for j in clean
                ]
                sensitive = _flags(worst, worst_within, alpha)[clean.index(i)]
        out.append(
            FamilyVerdict(
                key=m.key,
                p_value=m.p_value,
                sequential_p=m.sequential_p,
                adjusted_p=adj,
                family_size=size,
                flagged=flag,
                error_sensitive=sensitive,
            )
        )
    return tuple(out)


def decide_alone(member: FamilyMember, *, alpha: float, family_size: int) -> FamilyVerdict:
    """One test's call before the rest of its family is known: Bonferroni at alpha / F.

    Holm rejects everything this rejects (its first step is alpha / F), so a flag given here
    stands; `decide_family` over the whole run can only add flags and error sensitivity.
    """
    size = 1 if member.canary else family_size
    level = alpha / size
    flagged = member.sequential_p <= level and not member.within_margin
    sensitive = (
        not flagged
        and member.worst_case_p is not None
        and member.worst_case_p <= level
        and not member.worst_case_within_margin
    )
    return FamilyVerdict(
        key=member.key,
        p_value=member.p_value,
        sequential_p=member.sequential_p,
        adjusted_p=min(1.0, size * member.sequential_p),
        family_size=size,
        flagged=flagged,
        error_sensitive=sensitive,
    )
