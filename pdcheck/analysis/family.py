"""The run's decision: Holm across its clean tests' hypotheses, so a clean sweep fails w.p. ≤ alpha.

Every clean test (a clean cell at one concurrency level; its repeats pooled) gives a sequential
p-value for "no drop" (`design.py`) and, where SUSPECT is judged (logprobs and a control: the
baseline repeated, or a control run), a one-sided Fisher p-value for "no more corruption-grade
divergences than the control" (`paired.py`). Both are hypotheses of one family: a clean sweep
fails if either kind is rejected, so both are in the count. Holm's step-down procedure sorts
the F p-values, p_(1) ≤ … ≤ p_(F), and rejects p_(j) while p_(j) ≤ alpha / (F − j + 1). It
controls the family-wise error at alpha under any dependence between the hypotheses (cells
share baselines and servers; a test's two hypotheses share its records), so the chance that a
sweep with no drop and no corruption anywhere gives any REGRESSION or SUSPECT is at most alpha,
however many cells and levels it has. The adjusted p-value is max_{i ≤ j} min(1, (F − i + 1)·p_(i)).

**The planned family.** F is the number of hypotheses planned over the whole selection
(`family_size`), not the number that happen to be present: a shard holds only some of them,
and Holm over the present ones with the planned F still controls the error over all shards
together (the first true null rejected in a shard needs p ≤ alpha / (F − j + 1) with j − 1 rejected
before it in that shard, and F − j + 1 ≥ the number of true nulls, Holm's own argument). When
every hypothesis is present it is Holm itself, so a merged run reaches the unsharded verdicts.

A rejected accuracy hypothesis is a REGRESSION unless its last look showed the drop within the
margin; a rejected SUSPECT hypothesis is a SUSPECT.

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


def holm_adjust(p_values: Sequence[float], *, family_size: int | None = None) -> tuple[float, ...]:
    """Holm-adjusted p-values, in the input order, in a family of `family_size` (default: all given).

    With fewer p-values than `family_size` (a shard), the absent ones count as the largest.
    """
    f = max(len(p_values), family_size or 0)
    order = sorted(range(len(p_values)), key=lambda i: p_values[i])
    adjusted = [1.0] * len(p_values)
    running = 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (f - rank) * p_values[i]))
        adjusted[i] = running
    return tuple(adjusted)


@dataclass(frozen=True)
class FamilyMember:
    """One test as the run sees it: its accuracy hypothesis and, if judged, its SUSPECT one."""

    key: str  # e.g. "<cell id>@c8"
    p_value: float  # raw exact McNemar p at the last look
    sequential_p: float
    within_margin: bool
    canary: bool = False
    worst_case_p: float | None = None  # sequential p with PD-only errors scored as PD-wrong
    worst_case_within_margin: bool = False
    suspect_p: float | None = None  # None: SUSPECT not judged (no logprobs, or no control)


@dataclass(frozen=True)
class FamilyVerdict:
    """The run-level decision for one test."""

    key: str
    p_value: float
    sequential_p: float
    adjusted_p: float
    family_size: int  # hypotheses in the family; 1 for a canary
    flagged: bool  # REGRESSION
    error_sensitive: bool  # would be flagged with PD-only errors scored as wrong
    suspect_adjusted_p: float | None = None
    suspect_flagged: bool = False  # SUSPECT


def _hypotheses(
    members: Sequence[FamilyMember], clean: Sequence[int], worst: int | None = None
) -> tuple[list[tuple[int, bool]], list[float], list[bool]]:
    """The clean members' hypotheses as (member, is_suspect), p-values and within-margin flags;
    member `worst` with its worst-case accuracy p."""
    keys: list[tuple[int, bool]] = []
    ps: list[float] = []
    within: list[bool] = []
    for i in clean:
        m = members[i]
        if i == worst and m.worst_case_p is not None:
            keys.append((i, False))
            ps.append(m.worst_case_p)
            within.append(m.worst_case_within_margin)
        else:
            keys.append((i, False))
            ps.append(m.sequential_p)
            within.append(m.within_margin)
        if m.suspect_p is not None:
            keys.append((i, True))
            ps.append(m.suspect_p)
            within.append(False)
    return keys, ps, within


def _calls(
    members: Sequence[FamilyMember],
    clean: Sequence[int],
    alpha: float,
    family_size: int | None,
    worst: int | None = None,
) -> tuple[dict[tuple[int, bool], float], dict[tuple[int, bool], bool], int]:
    keys, ps, within = _hypotheses(members, clean, worst)
    size = max(len(ps), family_size or 0)
    adjusted = holm_adjust(ps, family_size=size)
    flags = [a <= alpha and not w for a, w in zip(adjusted, within, strict=True)]
    return dict(zip(keys, adjusted, strict=True)), dict(zip(keys, flags, strict=True)), size


def decide_family(
    members: Sequence[FamilyMember], *, alpha: float, family_size: int | None = None
) -> tuple[FamilyVerdict, ...]:
    """Holm over the clean members' hypotheses (in a family of at least `family_size`), each
    canary alone; results in the input order."""
    clean = [i for i, m in enumerate(members) if not m.canary]
    adjusted, flagged, size = _calls(members, clean, alpha, family_size)
    out = []
    for i, m in enumerate(members):
        if m.canary:
            out.append(decide_alone(m, alpha=alpha, family_size=1))
            continue
        flag = flagged[(i, False)]
        sensitive = False
        if not flag and m.worst_case_p is not None and m.worst_case_p < m.sequential_p:
            sensitive = _calls(members, clean, alpha, family_size, worst=i)[1][(i, False)]
        out.append(
            FamilyVerdict(
                key=m.key,
                p_value=m.p_value,
                sequential_p=m.sequential_p,
                adjusted_p=adjusted[(i, False)],
                family_size=size,
                flagged=flag,
                error_sensitive=sensitive,
                suspect_adjusted_p=adjusted.get((i, True)),
                suspect_flagged=flagged.get((i, True), False),
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
    suspect = member.suspect_p
    return FamilyVerdict(
        key=member.key,
        p_value=member.p_value,
        sequential_p=member.sequential_p,
        adjusted_p=min(1.0, size * member.sequential_p),
        family_size=size,
        flagged=flagged,
        error_sensitive=sensitive,
        suspect_adjusted_p=None if suspect is None else min(1.0, size * suspect),
        suspect_flagged=suspect is not None and suspect <= level,
    )
