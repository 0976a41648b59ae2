"""The numeric core of the paired comparison: pure functions on discordant-pair counts.

Why paired: baseline and PD answer the same questions, so their errors are correlated and
Var(PD - baseline) = Var(PD) + Var(baseline) - 2 Cov. Only the discordant pairs carry
information about the difference: `worse` (baseline right, PD wrong) and `better` (baseline
wrong, PD right), out of `n` pairs. Δ = (better - worse) / n.

- Test: exact McNemar, i.e. a binomial test of `worse` out of `worse + better` at 1/2. The
  gate is one-sided ("PD is worse"), because a PD that answers *more* questions correctly is
  not a regression; the p-value is P(Binom(m, 1/2) >= worse).
- Interval: Tango's (1998) score interval for the difference of paired proportions. It keeps
  its coverage with few discordant pairs, stays inside [-1, 1], and is defined with zero
  discordant pairs (Wald collapses to a zero-width interval there), which is the common case
  for a healthy PD on deterministic CPU kernels. Newcombe's method 10 behaves similarly but
  needs a correlation correction; a bootstrap is unreliable with a handful of discordant pairs.
- Corruption-grade divergences against a control: one-sided Fisher exact test on the 2x2
  table (divergent / not) x (PD / control), conditional so it is exact at small counts.

All array functions accept numpy arrays, so the simulation tests run 2,000 cells at once
through the same code the verdict uses.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import numpy.typing as npt
from scipy import optimize, special, stats

__all__ = [
    "drop_within_margin",
    "fisher_greater_p",
    "mcnemar_worse_p",
    "tango_interval",
    "tango_score",
]

Floats = npt.NDArray[np.float64]
Bools = npt.NDArray[np.bool_]


def mcnemar_worse_p(worse: npt.ArrayLike, better: npt.ArrayLike) -> Floats:
    """One-sided exact McNemar p-value for "PD is worse": P(Binom(worse+better, 1/2) >= worse).

    Works element-wise on arrays; 1.0 where there are no discordant pairs.
    """
    w = np.asarray(worse, dtype=np.float64)
    m = w + np.asarray(better, dtype=np.float64)
    # P(X >= w) = I_{1/2}(w, m - w + 1) for 1 <= w <= m: the regularized incomplete beta, which
    # is the binomial tail without scipy.stats' per-call overhead (the simulations call it a lot).
    inside = (w >= 1) & (m > 0)
    p: Any = special.betainc(np.where(inside, w, 1.0), np.where(inside, m - w + 1, 1.0), 0.5)
    return np.asarray(np.where(inside, p, 1.0), dtype=np.float64)


def _score_terms(
    delta: Any, worse: Any, better: Any, n: Any, sqrt: Any, maximum: Any
) -> tuple[Any, Any]:
    """(variance under H0, numerator) of Tango's score for H0: Δ = delta, on floats or arrays.

    In Tango's notation x12 = better, x21 = worse; p21 is its restricted MLE under H0.
    """
    a = 2.0 * n
    b = -better - worse + (2.0 * n - better + worse) * delta
    c = -worse * delta * (1.0 - delta)
    p21 = (-b + sqrt(maximum(b * b - 4.0 * a * c, 0.0))) / (2.0 * a)
    return n * (2.0 * p21 + delta * (1.0 - delta)), better - worse - n * delta


def tango_score(
    delta: npt.ArrayLike, worse: npt.ArrayLike, better: npt.ArrayLike, n: npt.ArrayLike
) -> Floats:
    """Tango's score statistic for H0: Δ = delta, with Δ = (better - worse)/n (element-wise).

    At delta = 0 it is McNemar's z, (better - worse)/sqrt(worse + better).
    """
    var, diff = _score_terms(
        np.asarray(delta, dtype=np.float64),
        np.asarray(worse, dtype=np.float64),
        np.asarray(better, dtype=np.float64),
        np.asarray(n, dtype=np.float64),
        np.sqrt,
        np.maximum,
    )
    score = diff / np.sqrt(np.where(var > 0, var, 1.0))
    edge = np.where(diff == 0, 0.0, np.copysign(np.inf, diff))
    return np.asarray(np.where(var > 0, score, edge), dtype=np.float64)


def _tango_score(delta: float, worse: int, better: int, n: int) -> float:
    """The scalar form, for the root finder (a numpy call per step would cost 20x)."""
    var, diff = _score_terms(delta, float(worse), float(better), float(n), math.sqrt, max)
    if var <= 0.0:
        return 0.0 if diff == 0 else math.copysign(math.inf, diff)
    return float(diff / math.sqrt(var))


def drop_within_margin(
    worse: npt.ArrayLike,
    better: npt.ArrayLike,
    n: npt.ArrayLike,
    *,
    margin_pts: float,
    alpha: float,
) -> Bools:
    """True where the one-sided 1 − alpha upper bound on the drop is at most `margin_pts`.

    Tango's bound is where his score crosses z, and the score falls as Δ rises, so "the lower
    bound on Δ is at least −margin" is "the score test of Δ = −margin rejects at alpha". The
    same bound as `tango_interval(..., confidence=1 - 2 * alpha)`'s low end, on arrays.
    """
    nn = np.asarray(n)
    z = float(stats.norm.ppf(1.0 - alpha))
    score = tango_score(-margin_pts / 100.0, worse, better, np.maximum(nn, 1))
    return np.asarray((score >= z) & (nn > 0), dtype=np.bool_)


def tango_interval(
    worse: int, better: int, n: int, *, confidence: float = 0.95
) -> tuple[float, float]:
    """Two-sided Tango score interval for Δ = (better - worse)/n, as fractions in [-1, 1].

    The bounds are where the score statistic crosses ±z; it decreases in Δ, so each bound is
    one bracketed root.
    """
    if n <= 0:
        raise ValueError("tango_interval needs at least one pair (n > 0)")
    if min(worse, better) < 0 or worse + better > n:
        raise ValueError(f"counts out of range: worse={worse}, better={better}, n={n}")
    z = float(stats.norm.ppf(0.5 + confidence / 2.0))
    est = (better - worse) / n
    eps = 1e-12

    def lower_fn(d: float) -> float:
        return _tango_score(d, worse, better, n) - z

    def upper_fn(d: float) -> float:
        return _tango_score(d, worse, better, n) + z

    lo = (
        -1.0
        if lower_fn(-1.0 + eps) <= 0
        else optimize.brentq(lower_fn, -1.0 + eps, est, xtol=1e-10)
    )
    hi = 1.0 if upper_fn(1.0 - eps) >= 0 else optimize.brentq(upper_fn, est, 1.0 - eps, xtol=1e-10)
    return lo, hi


def fisher_greater_p(k_test: int, n_test: int, k_control: int, n_control: int) -> float:
    """One-sided Fisher exact p-value that the test group's rate k/n exceeds the control's."""
    if n_test <= 0 or n_control <= 0:
        return 1.0
    table = [[k_test, n_test - k_test], [k_control, n_control - k_control]]
    return float(stats.fisher_exact(table, alternative="greater").pvalue)
