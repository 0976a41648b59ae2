"""Power of the paired test: the smallest drop a run of n questions can detect, and the n a margin needs.

Method: the normal approximation to McNemar's test (Connor 1987). For a true drop δ with
discordance d (the fraction of questions answered differently), the one-sided test at alpha
has power

    Φ( (δ √n − z_{1−α} √d) / √(d − δ²) ).

The minimum detectable effect (MDE) is the δ at which that power equals the target (0.8).
d comes from the run itself (observed discordant pairs / n). A drop of δ makes at least δ of
the questions discordant, so d is floored at δ: a run where PD agrees with the baseline on
every question still has a finite MDE, about (z_{1−α} + z_{power})² / n.

Why it matters: when the configured margin is below the MDE, a real drop of the size the
margin protects against could pass unseen, so the verdict is INCONCLUSIVE with the n needed.
The MDE belongs to the significance test alone; the margin rule only ever removes rejections.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
from scipy import optimize, signal, stats

from pdcheck.analysis.design import Design
from pdcheck.analysis.stats import Floats, mcnemar_worse_p

__all__ = [
    "SIZING_TOLERANCE",
    "Operating",
    "Power",
    "PowerRule",
    "drop_probabilities",
    "minimum_detectable_effect",
    "n_needed",
    "operating",
    "power_at",
    "power_rule",
    "summarize_power",
    "sweep_pass_points",
    "tolerated_discordance",
]

DEFAULT_POWER = 0.8


def power_at(drop: float, *, n: int, discordance: float, alpha: float) -> float:
    """Approximate power of the one-sided McNemar test to see a true drop `drop` (fraction) at n."""
    if drop <= 0:
        return alpha
    d = max(discordance, drop)
    spread = math.sqrt(max(d - drop * drop, 1e-12))
    z_alpha = stats.norm.ppf(1 - alpha)
    return float(stats.norm.cdf((drop * math.sqrt(n) - z_alpha * math.sqrt(d)) / spread))


def minimum_detectable_effect(
    *, n: int, discordance: float, alpha: float, power: float = DEFAULT_POWER
) -> float:
    """The smallest true drop (fraction of questions) detected with `power` at n pairs."""
    if n <= 0:
        return 1.0
    if power_at(1.0, n=n, discordance=discordance, alpha=alpha) < power:
        return 1.0
    return float(
        optimize.brentq(
            lambda x: power_at(x, n=n, discordance=discordance, alpha=alpha) - power, 1e-9, 1.0
        )
    )


def n_needed(drop: float, *, discordance: float, alpha: float, power: float = DEFAULT_POWER) -> int:
    """Pairs needed to detect a true drop `drop` (fraction) with `power`; Connor's formula, rounded up."""
    if drop <= 0:
        raise ValueError("n_needed needs a positive drop (a margin of 0 points can never be shown)")
    d = max(discordance, drop)
    z_alpha = stats.norm.ppf(1 - alpha)
    z_power = stats.norm.ppf(power)
    n = float((z_alpha * math.sqrt(d) + z_power * math.sqrt(max(d - drop * drop, 0.0))) ** 2)
    return math.ceil(n / drop**2)


@dataclass(frozen=True)
class Power:
    """What this run could detect: the MDE at its n, and the n the margin needs."""

    n_pairs: int
    discordance: float
    alpha: float
    power: float
    mde_pts: float
    margin_pts: float
    n_needed_for_margin: int | None

    @property
    def underpowered(self) -> bool:
        return self.margin_pts < self.mde_pts


def summarize_power(
    *,
    n_pairs: int,
    discordance: float,
    alpha: float,
    margin_pts: float,
    power: float = DEFAULT_POWER,
) -> Power:
    """MDE at the run's n and the n needed for `margin_pts`, from the observed discordance."""
    mde = minimum_detectable_effect(n=n_pairs, discordance=discordance, alpha=alpha, power=power)
    needed = (
        n_needed(margin_pts / 100, discordance=discordance, alpha=alpha, power=power)
        if margin_pts > 0
        else None
    )
    return Power(
        n_pairs=n_pairs,
        discordance=discordance,
        alpha=alpha,
        power=power,
        mde_pts=100 * mde,
        margin_pts=margin_pts,
        n_needed_for_margin=needed,
    )


@dataclass(frozen=True)
class Operating:
    """How a design behaves at one true (p_worse, p_better): exact, by dynamic programming."""

    p_worse: float
    p_better: float
    flag: float  # P(REGRESSION) at the design's alpha_test
    flag_by_look: tuple[float, ...]  # P(REGRESSION at look k), one per look
    within: float  # P(an interim look showed the margin and stopped for PASS)
    within_end: float  # P(the test reached its last look and that look showed the margin)
    expected_pairs: float
    # P(the last look neither rejected nor showed the margin, with an observed discordance at
    # most `tolerated`: the power rule holds, so NO-DROP-SHOWN); 0 when no `tolerated` was given.
    powered_end: float = 0.0


def _increment(dn: int, p_worse: float, p_better: float, shape: tuple[int, int]) -> Floats:
    """P(ΔW = w, ΔB = b) over `dn` pairs (trinomial), cut to `shape`."""
    w = np.arange(shape[0])[:, None]
    b = np.arange(shape[1])[None, :]
    q = p_better / (1.0 - p_worse) if p_worse < 1 else 0.0
    pw: Any = stats.binom.pmf(w, dn, p_worse)
    pb: Any = stats.binom.pmf(b, np.maximum(dn - w, 0), q)
    return np.asarray(pw * pb, dtype=np.float64)


# (design, pairs) -> the margin rule on the largest (W, B) lattice asked for so far. The
# Clopper-Pearson quantiles behind it are most of `operating`'s cost, and root finding over d
# (`tolerated_discordance`, `sweep_pass_points`) asks for the same lattice again and again.
_SHOWN: dict[tuple[Design, int], npt.NDArray[np.bool_]] = {}


def _shown(design: Design, pairs: int, shape: tuple[int, int]) -> npt.NDArray[np.bool_]:
    cached = _SHOWN.get((design, pairs))
    if cached is None or cached.shape[0] < shape[0] or cached.shape[1] < shape[1]:
        rows = max(shape[0], 0 if cached is None else cached.shape[0])
        cols = max(shape[1], 0 if cached is None else cached.shape[1])
        w = np.arange(rows)[:, None]
        b = np.arange(cols)[None, :]
        cached = np.asarray(design.within_margin(w, b, pairs), dtype=np.bool_)
        if len(_SHOWN) > 256:
            _SHOWN.clear()
        _SHOWN[(design, pairs)] = cached
    return cached[: shape[0], : shape[1]]


_MCNEMAR: list[Floats] = []


def _mcnemar(shape: tuple[int, int]) -> Floats:
    """McNemar's one-sided p on the (W, B) lattice: the same for every design, so kept once."""
    if not _MCNEMAR or _MCNEMAR[0].shape[0] < shape[0] or _MCNEMAR[0].shape[1] < shape[1]:
        rows = max(shape[0], _MCNEMAR[0].shape[0] if _MCNEMAR else 0)
        cols = max(shape[1], _MCNEMAR[0].shape[1] if _MCNEMAR else 0)
        w = np.arange(rows)[:, None]
        b = np.arange(cols)[None, :]
        _MCNEMAR[:] = [mcnemar_worse_p(w, b)]
    return _MCNEMAR[0][: shape[0], : shape[1]]


def operating(
    design: Design,
    *,
    p_worse: float,
    p_better: float,
    alpha_test: float | None = None,
    tolerated: float | None = None,
) -> Operating:
    """Exact flag probability, chance of an early PASS and expected pairs of `design`.

    Pairs are i.i.d.: PD-worse with p_worse, PD-better with p_better. The joint law of (W, B)
    is carried from look to look on a lattice (an FFT convolution per block of pairs); mass
    that rejects, or that shows the margin at an interim look, leaves. This is the decision
    rule itself, looks, shares and margin bound included, not a normal approximation.
    """
    if not (p_worse >= 0 and p_better >= 0 and p_worse + p_better <= 1):
        raise ValueError(f"bad pair probabilities: p_worse={p_worse}, p_better={p_better}")

    def support(pairs: int) -> tuple[int, int]:
        return (
            int(stats.binom.isf(1e-13, pairs, p_worse)) + 2,
            int(stats.binom.isf(1e-13, pairs, p_better)) + 2,
        )

    state = np.ones((1, 1))
    flag = within = within_end = powered_end = pairs = 0.0
    by_look: list[float] = []
    done = 0
    for k, look in enumerate(design.looks):
        shape = support(look.pairs)
        inc = _increment(look.pairs - done, p_worse, p_better, support(look.pairs - done))
        conv: Any = signal.fftconvolve(state, inc)
        state = np.zeros(shape)
        cut = np.clip(np.asarray(conv, dtype=np.float64)[: shape[0], : shape[1]], 0.0, None)
        state[: cut.shape[0], : cut.shape[1]] = cut
        done = look.pairs
        w = np.arange(shape[0])[:, None]
        b = np.arange(shape[1])[None, :]
        shown = _shown(design, look.pairs, shape)
        rejected = design.rejects(
            k, w, b, look.pairs, alpha_test=alpha_test, within=shown, p_values=_mcnemar(shape)
        )
        stop = float(state[rejected].sum())
        flag += stop
        by_look.append(stop)
        state[rejected] = 0.0
        if k == len(design.looks) - 1:
            within_end = float(state[shown].sum())
            if tolerated is not None:
                # The power rule is monotone in the observed discordance (`tolerated_discordance`).
                powered = ~shown & ((w + b) <= tolerated * look.pairs)
                powered_end = float(state[powered].sum())
        elif look.equivalence:
            passed = float(state[shown].sum())
            within += passed
            stop += passed
            state[shown] = 0.0
        pairs += stop * look.pairs
    pairs += float(state.sum()) * design.planned_pairs
    return Operating(
        p_worse=p_worse,
        p_better=p_better,
        flag=min(flag, 1.0),
        flag_by_look=tuple(by_look),
        within=within,
        within_end=within_end,
        expected_pairs=pairs,
        powered_end=powered_end,
    )


def drop_probabilities(discordance: float, drop: float) -> tuple[float, float]:
    """(p_worse, p_better) for a true drop `drop` when PD and baseline disagree on `discordance`.

    As in Connor's formula, d is the disagreement of the run with the drop in it, floored at the
    drop (a drop of δ makes at least δ of the questions discordant).
    """
    d = min(max(discordance, drop), 1.0)
    return (d + drop) / 2.0, (d - drop) / 2.0


@dataclass(frozen=True)
class PowerRule:
    """The power rule: INCONCLUSIVE exactly when P(flag | drop = margin + extra) < target."""

    drop_pts: float
    discordance: float
    planned_pairs: int
    alpha_test: float
    power: float
    target: float
    # Set when the baseline answers fewer questions right than the drop: it cannot be seen.
    baseline_accuracy: float | None

    @property
    def underpowered(self) -> bool:
        return self.power < self.target


def power_rule(
    design: Design,
    *,
    discordance: float,
    extra_pts: float,
    baseline_accuracy: float | None = None,
    target: float = DEFAULT_POWER,
) -> PowerRule:
    """Exact power of `design` (at its alpha_test: a lone regression among the family) to flag a
    drop of margin + `extra_pts` at the run's discordance.

    A baseline that answers fewer than margin + extra of the questions right cannot lose that
    much: the power is 0 (all wrong on both sides is INCONCLUSIVE, not PASS).
    """
    drop = (design.margin_pts + extra_pts) / 100.0
    if drop <= 0 or drop > 1:
        raise ValueError(f"the power rule needs a drop in (0, 100] points, got {100 * drop:g}")
    if baseline_accuracy is not None and baseline_accuracy < drop:
        power = 0.0
    else:
        p_worse, p_better = drop_probabilities(discordance, drop)
        power = operating(design, p_worse=p_worse, p_better=p_better).flag
    return PowerRule(
        drop_pts=100.0 * drop,
        discordance=discordance,
        planned_pairs=design.planned_pairs,
        alpha_test=design.alpha_test,
        power=power,
        target=target,
        baseline_accuracy=baseline_accuracy,
    )


# The bracket `tolerated_discordance` narrows to for what validate prints (a tenth of a point).
SIZING_TOLERANCE = 0.0002


@functools.lru_cache(maxsize=128)
def tolerated_discordance(
    design: Design,
    *,
    extra_pts: float,
    target: float = DEFAULT_POWER,
    tolerance: float = SIZING_TOLERANCE,
) -> float:
    """The largest discordance d at which `design` still meets the power rule: P(flag | drop =
    margin + `extra_pts`) ≥ `target`. Above it a clean cell is INCONCLUSIVE by construction
    (its n cannot exclude the drop), which fails the gate unless INCONCLUSIVE is allowed.

    0 when even d = the drop (every discordant pair PD-worse) is underpowered. Power falls as d
    rises (more discordant pairs at the same drop), so doubling brackets it and bisection finds
    it to `tolerance` (doubling first: the lattice, and the cost, grow with d).
    """
    drop = (design.margin_pts + extra_pts) / 100.0

    def powered(d: float) -> bool:
        return power_rule(design, discordance=d, extra_pts=extra_pts, target=target).power >= target

    if not powered(drop):
        return 0.0
    lo = drop
    while True:
        hi = min(2.0 * lo, 1.0)
        if not powered(hi):
            break
        if hi == 1.0:
            return 1.0
        lo = hi
    while hi - lo > tolerance:
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if powered(mid) else (lo, mid)
    return lo


def _level_pass(
    design: Design, tolerated: float, d: float, *, no_drop_shown: bool, inconclusive: bool
) -> float:
    """P(a clean level passes the gate | no drop, true discordance d), exact for the design
    (looks, shares and margin bound included): PASS, and NO-DROP-SHOWN (the power rule holds at
    the observed d) or INCONCLUSIVE where the policy lets them pass."""
    half = min(max(d, 0.0), 1.0) / 2.0
    o = operating(design, p_worse=half, p_better=half, tolerated=tolerated)
    if inconclusive and no_drop_shown:
        return 1.0 - o.flag
    return o.within + o.within_end + (o.powered_end if no_drop_shown else 0.0)


def sweep_pass_points(
    levels: Sequence[tuple[Design, float, int, bool, bool]],
    *,
    targets: Sequence[float] = (0.95, 0.5),
) -> dict[float, float | None]:
    """The true discordance d at which a clean sweep passes the gate with each target probability.

    `levels` are (design, power_extra_pts, how many clean levels share it, whether NO-DROP-SHOWN
    and INCONCLUSIVE pass the gate). A clean sweep has no drop; every clean level runs at the same
    true d. Each level's chance to pass is exact for its design (`operating`, with the power rule
    applied at the observed d as `decide` does); levels are taken as independent, so the sweep
    passes with the product. That product falls with d (a noisier level is more often
    underpowered), and root finding gives the d for each target: None when even d → 0 is below
    it (the false-alarm rate alone takes more than 1 − target).
    """
    cuts = [
        (design, count, tolerated_discordance(design, extra_pts=extra), nds, inc)
        for design, extra, count, nds, inc in levels
    ]

    seen: dict[float, float] = {}

    def passes(d: float) -> float:
        if d not in seen:
            seen[d] = math.prod(
                _level_pass(g, t, d, no_drop_shown=nds, inconclusive=inc) ** k
                for g, k, t, nds, inc in cuts
            )
        return seen[d]

    lo = 1e-4
    out: dict[float, float | None] = {}
    for target in targets:
        # Past twice the widest cut almost every level is underpowered; widen if it is not.
        hi = min(1.0, 2.0 * max(tolerated for _, _, tolerated, _, _ in cuts) + 0.05)
        while hi < 1.0 and passes(hi) >= target:
            hi = min(1.0, 2.0 * hi)
        if passes(lo) < target:
            out[target] = None
        elif passes(hi) >= target:
            out[target] = hi
        else:
            out[target] = float(
                optimize.brentq(lambda d, t=target: passes(d) - t, lo, hi, xtol=2e-4)
            )
    return out
