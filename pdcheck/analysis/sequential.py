"""Early stop (`--early-stop`): call a REGRESSION as soon as it is certain, at error rate alpha.

Method: a mixture sequential probability ratio test on the discordant pairs. Among questions
that the two sides answer differently, let X = 1 when PD is the one that is wrong. With no
regression X ~ Bernoulli(1/2). Against the alternative θ > 1/2 we mix the likelihood ratio over
a uniform prior on θ in [1/2, 1]:

    L_m = 2 ∫_{1/2}^{1} θ^k (1 − θ)^{m−k} dθ / (1/2)^m
        = 2^{m+1} · B(k+1, m−k+1) · I_{1/2}(m−k+1, k+1)

for k PD-worse pairs out of m discordant ones. Each θ's ratio is a nonnegative martingale under
θ = 1/2 (and a supermartingale when PD is better), so the mixture is too, and by Ville's
inequality P(sup_m L_m ≥ 1/alpha) ≤ alpha: stopping the first time L_m ≥ 1/alpha keeps the
type-I error at alpha however often it is checked (an always-valid test; no fixed looks).
The stop also requires the observed drop to exceed the margin, which only removes rejections.

It stops only for REGRESSION. A pass needs the whole run: the margin rule and the agreement
test are judged at the end. A 0.86 → 0.11 collapse stops after about 10 questions.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy import special

from pdcheck.analysis.verdict import Verdict
from pdcheck.evals.records import QuestionRecord

__all__ = ["EarlyStop", "SequentialTest", "log_mixture_ratio", "replay"]


def log_mixture_ratio(worse, discordant):
    """log L_m for `worse` PD-worse pairs among `discordant` ones (element-wise on arrays)."""
    k = np.asarray(worse, dtype=float)
    m = np.asarray(discordant, dtype=float)
    tail = special.betainc(m - k + 1, k + 1, 0.5)
    return (
        (m + 1) * math.log(2.0)
        + special.betaln(k + 1, m - k + 1)
        + np.log(np.maximum(tail, 1e-300))
    )


@dataclass(frozen=True)
class EarlyStop:
    """The decision to stop a cell early, with where and why."""

    verdict: Verdict
    n_pairs: int
    worse: int
    better: int
    log_ratio: float
    threshold_log_ratio: float
    reason: str


class SequentialTest:
    """Feed pairs as they finish; `should_stop()` returns an EarlyStop once a regression is certain.

    >>> t = SequentialTest(alpha=0.05, margin_pts=2.0)
    >>> t.add(baseline_correct=True, pd_correct=False)
    >>> t.should_stop() is None
    True
    """

    def __init__(self, *, alpha: float, margin_pts: float):
        if not 0 < alpha < 1:
            raise ValueError(f"alpha must be in (0, 1), got {alpha}")
        self.alpha = alpha
        self.margin_pts = margin_pts
        self.n_pairs = 0
        self.worse = 0
        self.better = 0
        self._stop: EarlyStop | None = None

    @property
    def threshold_log_ratio(self) -> float:
        return math.log(1.0 / self.alpha)

    def add(self, *, baseline_correct: bool, pd_correct: bool) -> None:
        """Record one question answered on both sides (skip request errors: they are not pairs)."""
        self.n_pairs += 1
        self.worse += baseline_correct and not pd_correct
        self.better += pd_correct and not baseline_correct
        if self._stop is None:
            self._stop = self._check()

    def _check(self) -> EarlyStop | None:
        log_ratio = float(log_mixture_ratio(self.worse, self.worse + self.better))
        drop_pts = 100.0 * (self.worse - self.better) / self.n_pairs
        if log_ratio < self.threshold_log_ratio or drop_pts <= self.margin_pts:
            return None
        return EarlyStop(
            verdict=Verdict.REGRESSION,
            n_pairs=self.n_pairs,
            worse=self.worse,
            better=self.better,
            log_ratio=log_ratio,
            threshold_log_ratio=self.threshold_log_ratio,
            reason=(
                f"mixture SPRT crossed 1/alpha={1 / self.alpha:g} after {self.n_pairs} pairs "
                f"({self.worse} PD-worse vs {self.better} PD-better), drop {drop_pts:.1f} pts > {self.margin_pts:g}"
            ),
        )

    def should_stop(self) -> EarlyStop | None:
        """The first stopping decision reached so far, or None to keep going."""
        return self._stop


def replay(
    baseline_records: Sequence[QuestionRecord],
    pd_records: Sequence[QuestionRecord],
    *,
    alpha: float,
    margin_pts: float,
) -> EarlyStop | None:
    """Where the early stop would have called a finished run: PD records in file (finish) order.

    Questions that failed on either side are not pairs and are skipped, as during a live run.
    """
    base = {r.index: r for r in baseline_records}
    test = SequentialTest(alpha=alpha, margin_pts=margin_pts)
    for r in pd_records:
        b = base.get(r.index)
        if b is None or not (b.ok and r.ok):
            continue
        test.add(baseline_correct=b.correct, pd_correct=r.correct)
        if test.should_stop() is not None:
            break
    return test.should_stop()
