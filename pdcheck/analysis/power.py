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

import math
from dataclasses import dataclass

from scipy import optimize, stats

__all__ = ["Power", "minimum_detectable_effect", "n_needed", "power_at", "summarize_power"]

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
    n = (z_alpha * math.sqrt(d) + z_power * math.sqrt(max(d - drop * drop, 0.0))) ** 2 / drop**2
    return math.ceil(n)


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
