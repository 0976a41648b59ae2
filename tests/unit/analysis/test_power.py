"""Power: the MDE at the run's n, and the n needed for a margin, from the observed discordance."""

from __future__ import annotations

import numpy as np
import pytest

from pdcheck.analysis.design import Design
from pdcheck.analysis.power import (
    minimum_detectable_effect,
    n_needed,
    power_at,
    power_rule,
    tolerated_discordance,
)
from pdcheck.analysis.stats import mcnemar_worse_p


def test_mde_shrinks_with_n_and_grows_with_discordance():
    """More questions detect smaller drops; noisier pairs need bigger ones."""
    small = minimum_detectable_effect(n=200, discordance=0.05, alpha=0.05)
    big = minimum_detectable_effect(n=1319, discordance=0.05, alpha=0.05)
    noisy = minimum_detectable_effect(n=1319, discordance=0.15, alpha=0.05)
    assert big < small
    assert noisy > big


def test_power_at_the_mde_is_the_target():
    """By definition the approximate power at the MDE is 0.8."""
    mde = minimum_detectable_effect(n=500, discordance=0.06, alpha=0.05)
    assert power_at(mde, n=500, discordance=0.06, alpha=0.05) == pytest.approx(0.8, abs=1e-6)


def test_n_needed_inverts_the_mde():
    """The n needed for a drop has an MDE at (about) that drop."""
    n = n_needed(0.02, discordance=0.03, alpha=0.05)
    assert minimum_detectable_effect(n=n, discordance=0.03, alpha=0.05) == pytest.approx(
        0.02, rel=0.02
    )


def test_perfect_agreement_still_has_a_finite_mde():
    """With zero observed discordance the MDE is about (z_a + z_b)^2 / n, not zero."""
    mde = minimum_detectable_effect(n=1000, discordance=0.0, alpha=0.05)
    assert 0.004 < mde < 0.008


def test_normal_approximation_matches_the_exact_test_by_simulation():
    """At the MDE the exact one-sided McNemar test rejects about 80% of the time (within 7 points)."""
    n, d, alpha = 800, 0.08, 0.05
    mde = minimum_detectable_effect(n=n, discordance=d, alpha=alpha)
    rng = np.random.default_rng(3)
    p_worse = (d + mde) / 2
    p_better = (d - mde) / 2
    counts = rng.multinomial(n, [p_worse, p_better, 1 - p_worse - p_better], size=4000)
    rate = float(np.mean(mcnemar_worse_p(counts[:, 0], counts[:, 1]) < alpha))
    assert abs(rate - 0.8) < 0.07


def test_zero_margin_cannot_be_powered():
    """A margin of 0 points can never be shown; asking for its n is an error that says so."""
    with pytest.raises(ValueError, match="positive drop"):
        n_needed(0.0, discordance=0.05, alpha=0.05)


def test_tolerated_discordance_is_where_the_power_rule_stops_holding():
    """At the tolerated d the design still has 80% power for margin + 1 point; just above it, not
    (a clean cell there is INCONCLUSIVE by construction)."""
    design = Design.plan(300, alpha=0.05, margin_pts=5.0, family_size=4)
    d = tolerated_discordance(design, extra_pts=1.0)
    assert 0.06 < d < 1.0
    assert power_rule(design, discordance=d, extra_pts=1.0).power >= 0.8
    assert power_rule(design, discordance=d + 0.002, extra_pts=1.0).power < 0.8
    tiny = Design.plan(20, alpha=0.05, margin_pts=2.0, family_size=24)
    assert tolerated_discordance(tiny, extra_pts=1.0) == 0.0
