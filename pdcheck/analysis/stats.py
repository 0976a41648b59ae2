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

import numpy as np
from scipy import optimize, stats

__all__ = ["fisher_greater_p", "mcnemar_worse_p", "tango_interval"]


def mcnemar_worse_p(worse, better):
    """One-sided exact McNemar p-value for "PD is worse": P(Binom(worse+better, 1/2) >= worse).

    Works element-wise on arrays; 1.0 where there are no discordant pairs.
    """
    worse = np.asarray(worse)
    m = worse + np.asarray(better)
    p = stats.binom.sf(worse - 1, m, 0.5)
    return np.where(m > 0, p, 1.0)


def _tango_score(delta: float, worse: int, better: int, n: int) -> float:
    """Tango's score statistic for H0: Δ = delta, with Δ = (better - worse)/n.

    In Tango's notation x12 = better, x21 = worse; p21 is its restricted MLE under H0.
    """
    a = 2.0 * n
    b = -better - worse + (2.0 * n - better + worse) * delta
    c = -worse * delta * (1.0 - delta)
    p21 = (-b + math.sqrt(max(b * b - 4.0 * a * c, 0.0))) / (2.0 * a)
    var = n * (2.0 * p21 + delta * (1.0 - delta))
    diff = better - worse - n * delta
    if var <= 0.0:
        return 0.0 if diff == 0 else math.copysign(math.inf, diff)
    return diff / math.sqrt(var)


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
