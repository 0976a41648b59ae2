"""Greedy agreement: do PD and the baseline produce the same tokens, and where do they part?

With temperature 0 on both sides a perfect KV transfer gives the same completion token for
token, except where two candidates are within numeric jitter of each other. So at the first
divergence we look at the baseline's top-2 logprob margin there:

- margin < `tie_epsilon_nats`: a near-tie flip, numeric jitter (hybrid models in bf16 flip at
  near-ties through PD even when the transfer is perfect);
- margin >= epsilon: corruption-grade, the PD side chose a token the baseline was sure against;
- margin unknown (no logprobs, or the baseline stopped there): unclassified, reported as such.

Sequences are compared by token ids when both sides have them, else by the logprobs' token
strings, else by completion text (then positions are characters, and `position_unit` says so).
The SUSPECT signal compares corruption-grade counts against a control run (see
`stats.fisher_greater_p`); that test lives in `paired.py`, which knows the control.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from pdcheck.evals.records import QuestionRecord

__all__ = [
    "Agreement",
    "Divergence",
    "first_divergence",
    "margin_jitter_nats",
    "measure_agreement",
]

TIE = "tie"
CORRUPTION = "corruption"
UNCLASSIFIED = "unclassified"
# Bucket edges for the divergence-position histogram (tokens or characters).
POSITION_BUCKETS = (0, 1, 4, 16, 64, 256)
# The tie threshold is this quantile of the top-2 margin's change between two runs where they
# still agree; below MIN_JITTER_POSITIONS aligned positions the jitter is not measured.
JITTER_QUANTILE = 0.999
MIN_JITTER_POSITIONS = 200


@dataclass(frozen=True)
class Divergence:
    """Where one question's two completions first differ, and how sure the baseline was there."""

    index: int
    position: int
    margin_nats: float | None
    grade: str  # "tie" | "corruption" | "unclassified"


@dataclass(frozen=True)
class Agreement:
    """Token-for-token agreement over the pairs answered on both sides."""

    n_pairs: int
    n_identical: int
    position_unit: str  # "tokens", "chars", or "mixed" when only some records carry tokens
    n_tie: int
    n_corruption: int
    n_unclassified: int
    tie_epsilon_nats: float
    position_p50: float | None
    position_p90: float | None
    # "<lo>-<hi>" bucket label -> number of first divergences in it.
    position_histogram: dict[str, int]
    divergences: tuple[Divergence, ...]

    @property
    def exact_match_fraction(self) -> float | None:
        return self.n_identical / self.n_pairs if self.n_pairs else None

    @property
    def has_margins(self) -> bool:
        """True when at least one divergence could be classified (logprobs were recorded)."""
        return self.n_tie + self.n_corruption > 0


def _sequence(record: QuestionRecord) -> tuple[Sequence[int] | Sequence[str] | str, str]:
    if record.token_ids is not None:
        return record.token_ids, "tokens"
    if record.logprobs is not None:
        return tuple(t.token for t in record.logprobs), "tokens"
    return record.completion or "", "chars"


def first_divergence(
    baseline: QuestionRecord, pd: QuestionRecord, *, tie_epsilon_nats: float
) -> Divergence | None:
    """The first position where PD's completion differs from the baseline's, graded; None if identical."""
    base_seq, base_unit = _sequence(baseline)
    pd_seq, pd_unit = _sequence(pd)
    if base_unit != pd_unit:
        # One side has tokens, the other only text: compare text, positions in characters.
        base_seq, pd_seq, base_unit = baseline.completion or "", pd.completion or "", "chars"
    if tuple(base_seq) == tuple(pd_seq):
        return None
    common = min(len(base_seq), len(pd_seq))
    position = next((i for i in range(common) if base_seq[i] != pd_seq[i]), common)
    margin = None
    if (
        base_unit == "tokens"
        and baseline.logprobs is not None
        and position < len(baseline.logprobs)
    ):
        margin = baseline.logprobs[position].top2_margin
    if margin is None:
        grade = UNCLASSIFIED
    elif margin < tie_epsilon_nats:
        grade = TIE
    else:
        grade = CORRUPTION
    return Divergence(index=baseline.index, position=position, margin_nats=margin, grade=grade)


def margin_jitter_nats(pairs: Sequence[tuple[QuestionRecord, QuestionRecord]]) -> float | None:
    """How much the top-2 margin moves between two runs while their tokens still agree (nats).

    Over every position before the first divergence where both runs recorded a margin, the
    `JITTER_QUANTILE` of |margin_a − margin_b|. A flip at a baseline margin below it is what
    this pair of configurations does by numeric jitter alone. None with too few positions.
    """
    changes: list[float] = []
    for a, b in pairs:
        if a.logprobs is None or b.logprobs is None:
            continue
        for x, y in zip(a.logprobs, b.logprobs, strict=False):
            if x.token != y.token:
                break
            mx, my = x.top2_margin, y.top2_margin
            if mx is not None and my is not None and math.isfinite(mx) and math.isfinite(my):
                changes.append(abs(mx - my))
    if len(changes) < MIN_JITTER_POSITIONS:
        return None
    return float(np.quantile(changes, JITTER_QUANTILE))


def _histogram(positions: list[int]) -> dict[str, int]:
    edges = list(POSITION_BUCKETS)
    labels = [f"{lo}-{hi - 1}" for lo, hi in itertools.pairwise(edges)] + [f"{edges[-1]}+"]
    counts = dict.fromkeys(labels, 0)
    for pos in positions:
        slot = int(np.searchsorted(edges, pos, side="right")) - 1
        counts[labels[slot]] += 1
    return counts


def measure_agreement(
    pairs: Sequence[tuple[QuestionRecord, QuestionRecord]], *, tie_epsilon_nats: float
) -> Agreement:
    """Agreement over (baseline, PD) pairs of records that both succeeded, already paired by index."""
    divergences = [
        d
        for b, p in pairs
        if (d := first_divergence(b, p, tie_epsilon_nats=tie_epsilon_nats)) is not None
    ]
    units = {_sequence(b)[1] for b, _ in pairs} | {_sequence(p)[1] for _, p in pairs}
    positions = [d.position for d in divergences]
    grades = [d.grade for d in divergences]
    return Agreement(
        n_pairs=len(pairs),
        n_identical=len(pairs) - len(divergences),
        position_unit=units.pop() if len(units) == 1 else ("mixed" if units else "tokens"),
        n_tie=grades.count(TIE),
        n_corruption=grades.count(CORRUPTION),
        n_unclassified=grades.count(UNCLASSIFIED),
        tie_epsilon_nats=tie_epsilon_nats,
        position_p50=float(np.percentile(positions, 50)) if positions else None,
        position_p90=float(np.percentile(positions, 90)) if positions else None,
        position_histogram=_histogram(positions),
        divergences=tuple(divergences),
    )
