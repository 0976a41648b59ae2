"""Early stop (`--early-stop`): the group-sequential form of the one paired test (`design.py`).

Pairs arrive in finish order, every repeat's pairs in one stream. At each planned interim look
the test either rejects at its share of alpha (REGRESSION, certain: its sequential p-value is
already below alpha / family size, which Holm always rejects), or shows the drop within the
margin (PASS, certain), or goes on. The last look is not taken here: the run decides it, with
Holm across its clean tests (`family.py`), on `SequentialTest.result()`.

A 40-point collapse stops within 60 pairs; a clean cell at 5% disagreement stops for PASS after
about two thirds of the questions on average (exact figures in docs/analysis.md).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from pdcheck.analysis.design import Design, LookOutcome
from pdcheck.analysis.verdict import Verdict, look_verdict
from pdcheck.evals.records import QuestionRecord

__all__ = ["EarlyStop", "SequentialResult", "SequentialTest", "sequential_result"]


@dataclass(frozen=True)
class EarlyStop:
    """The decision to stop a test at an interim look, with where and why."""

    verdict: Verdict  # REGRESSION, or PASS when the margin was shown
    n_pairs: int
    worse: int
    better: int
    reason: str
    # None in a stop recorded before issue 17 (the mixture SPRT had no per-look p-value).
    p_value: float | None = None
    threshold: float | None = None


@dataclass(frozen=True)
class SequentialResult:
    """The test's looks so far and its sequential p-value (the run applies Holm to it)."""

    n_pairs: int
    worse: int
    better: int
    p_value: float  # raw exact McNemar p at the last look taken
    sequential_p: float  # min_k p_k / s_k: the p-value Holm adjusts
    within_margin: bool  # the last look showed the drop within the margin
    looks: tuple[LookOutcome, ...]
    stop: EarlyStop | None


class SequentialTest:
    """Feed pairs as they finish; `should_stop()` returns an EarlyStop once the verdict is certain.

    >>> t = SequentialTest(Design.plan(1319, alpha=0.05, margin_pts=2.0, early_stop=True))
    >>> t.add(baseline_correct=True, pd_correct=False)
    >>> t.should_stop() is None
    True
    """

    def __init__(self, design: Design):
        self.design = design
        self.n_pairs = 0
        self.worse = 0
        self.better = 0
        self._looks: list[LookOutcome] = []
        self._stop: EarlyStop | None = None

    def add(self, *, baseline_correct: bool, pd_correct: bool) -> None:
        """Record one question answered on both sides (skip request errors: they are not pairs)."""
        if self._stop is not None:
            return
        self.n_pairs += 1
        self.worse += baseline_correct and not pd_correct
        self.better += pd_correct and not baseline_correct
        k = len(self._looks)
        if k < len(self.design.interim) and self.n_pairs == self.design.looks[k].pairs:
            self._look(k)

    def _look(self, k: int) -> None:
        o = self.design.outcome(k, self.worse, self.better, self.n_pairs)
        self._looks.append(o)
        drop = 100.0 * (self.worse - self.better) / self.n_pairs
        margin = self.design.margin_pts
        verdict = look_verdict(o, equivalence=self.design.looks[k].equivalence)
        if verdict is Verdict.REGRESSION:
            why = (
                f"McNemar p={o.p_value:.2g} ≤ {o.threshold:.2g} (its share of alpha), drop "
                f"{drop:.1f} pts, a drop beyond {margin:g} pts not excluded"
            )
        elif verdict is Verdict.PASS:
            level = 100 * (1 - self.design.equivalence_alpha)
            why = f"the drop is within the {margin:g}-pt margin (one-sided ≥{level:g}% bound), drop {drop:.1f} pts"
        else:
            return
        self._stop = EarlyStop(
            verdict=verdict,
            n_pairs=o.n_pairs,
            worse=o.worse,
            better=o.better,
            p_value=o.p_value,
            threshold=o.threshold,
            reason=f"look {k + 1} after {o.n_pairs} pairs: {why}",
        )

    def should_stop(self) -> EarlyStop | None:
        """The stopping decision reached so far, or None to keep going."""
        return self._stop

    def result(self) -> SequentialResult:
        """The looks taken, plus the final look at the current count unless the test stopped."""
        looks = list(self._looks)
        if self._stop is None and self.n_pairs > 0:
            last = len(self.design.looks) - 1
            looks.append(self.design.outcome(last, self.worse, self.better, self.n_pairs))
        final = looks[-1] if looks else None
        return SequentialResult(
            n_pairs=self.n_pairs,
            worse=self.worse,
            better=self.better,
            p_value=final.p_value if final else 1.0,
            sequential_p=self.design.sequential_p(tuple(looks)),
            within_margin=final.within_margin if final else False,
            looks=tuple(looks),
            stop=self._stop,
        )


def sequential_result(
    runs: Sequence[tuple[Sequence[QuestionRecord], Sequence[QuestionRecord]]],
    design: Design,
    *,
    pd_errors_wrong: bool = False,
) -> SequentialResult:
    """Replay (baseline, PD) record runs, repeat after repeat, PD records in file (finish) order.

    Questions that failed on either side are not pairs and are skipped, as during a live run.
    With `pd_errors_wrong`, a PD request that failed where the baseline answered is a pair with
    PD wrong: the worst case that request errors can hide.
    """
    test = SequentialTest(design)
    for baseline_records, pd_records in runs:
        base = {r.index: r for r in baseline_records}
        for r in pd_records:
            b = base.get(r.index)
            if b is None or not b.ok or not (r.ok or pd_errors_wrong):
                continue
            test.add(baseline_correct=b.correct, pd_correct=r.ok and r.correct)
            if test.should_stop() is not None:
                return test.result()
    return test.result()
