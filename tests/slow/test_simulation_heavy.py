"""The gate's error-rate bars that take seconds of CPU each: the clean sweep's false-alarm rate
(exact and by 3,000 simulated sweeps), the power at a 3-point drop and the 40-point collapse's
early stop, at `default-gpu`'s settings (tests/unit/analysis/test_simulation.py says how, and
holds the helpers; `-s` prints the numbers docs/analysis.md quotes)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from pdcheck.analysis.power import drop_probabilities, operating
from tests.unit.analysis.test_simulation import (
    ALPHA,
    DISCORDANCES,
    FAMILY,
    flagged,
    plan_design,
    simulate,
)


@pytest.mark.parametrize("early_stop", [False, True])
@pytest.mark.parametrize("repeats", [1, 3])
def test_clean_sweep_fails_at_most_alpha_exactly(repeats, early_stop):
    """24 independent clean tests: P(the sweep flags anything) ≤ alpha at every d (exact)."""
    design = plan_design(repeats, early_stop)
    rates = {}
    for d in DISCORDANCES:
        q = operating(design, p_worse=d / 2, p_better=d / 2).flag
        rates[d] = 1 - (1 - q) ** FAMILY
    print(json.dumps({"repeats": repeats, "early_stop": early_stop, "clean_sweep_fails": rates}))
    assert max(rates.values()) <= ALPHA


@pytest.mark.parametrize("early_stop", [False, True])
def test_clean_sweep_fails_at_most_alpha_monte_carlo(early_stop):
    """3,000 simulated clean sweeps per d through the run's code: fail rate ≤ alpha + 3 MC s.e."""
    rng = np.random.default_rng(17)
    sims = 3000
    rates = {}
    for d in DISCORDANCES:
        seq_p, within, _ = simulate(
            rng, plan_design(1, early_stop), [d / 2] * FAMILY, [d / 2] * FAMILY, sims
        )
        rates[d] = float(flagged(seq_p, within).any(axis=1).mean())
    print(json.dumps({"early_stop": early_stop, "monte_carlo_clean_sweep_fails": rates}))
    se = (ALPHA * (1 - ALPHA) / sims) ** 0.5
    assert max(rates.values()) <= ALPHA + 3 * se


@pytest.mark.parametrize("early_stop", [False, True])
def test_three_point_drop_is_flagged_90_percent_at_d_5(early_stop):
    """n = 1319, d = 5% (the disagreement of the run with the drop in it), one cell of 24 drops
    3 points: it is flagged ≥ 90% (exact at alpha/24, and by Monte Carlo through Holm)."""
    design = plan_design(1, early_stop)
    p_worse, p_better = drop_probabilities(0.05, 0.03)
    exact = operating(design, p_worse=p_worse, p_better=p_better).flag
    rng = np.random.default_rng(3)
    pw = [p_worse] + [0.025] * (FAMILY - 1)
    pb = [p_better] + [0.025] * (FAMILY - 1)
    seq_p, within, _ = simulate(rng, design, pw, pb, 2000)
    mc = float(flagged(seq_p, within)[:, 0].mean())
    print(json.dumps({"early_stop": early_stop, "power_3pt_d5_exact": exact, "monte_carlo": mc}))
    assert exact >= 0.90
    assert mc >= 0.90 - 3 * (0.9 * 0.1 / 2000) ** 0.5


def test_forty_point_collapse_stops_within_60_questions():
    """A 40-point drop (42.5% of pairs PD-worse, 2.5% PD-better: d = 45%) is stopped at the 30-
    or 60-pair look ≥ 95% of the time even at alpha/24; a lone test (a canary, `compare`) does so
    even with independent sides."""
    clean = plan_design(1, True)
    lone = plan_design(1, True, family_size=1)
    early = sum(look.pairs <= 60 for look in clean.looks)
    in_family = sum(operating(clean, p_worse=0.425, p_better=0.025).flag_by_look[:early])
    independent = 0.84 * 0.56, 0.16 * 0.44  # baseline 84% right, PD 44%, unrelated answers
    alone = sum(
        operating(lone, p_worse=independent[0], p_better=independent[1]).flag_by_look[:early]
    )
    in_family_indep = sum(
        operating(clean, p_worse=independent[0], p_better=independent[1]).flag_by_look[:early]
    )
    print(
        json.dumps(
            {
                "collapse_40_within_60_family_24": in_family,
                "independent_sides_family_24": in_family_indep,
                "independent_sides_alone": alone,
            }
        )
    )
    assert in_family >= 0.95
    assert alone >= 0.95


def test_equivalence_stopping_saves_questions_at_d_5():
    """Clean cells at d = 5% stop for PASS early enough to use ≥ 10% fewer questions with one
    repeat and ≥ 45% with three (exact; the exact margin bound is wider than Tango's was, which
    saved 36%); the false-alarm guarantee is the one checked above with early stop on."""
    saved = {}
    for d in (0.05, 0.15):
        for repeats in (1, 3):
            design = plan_design(repeats, True)
            o = operating(design, p_worse=d / 2, p_better=d / 2)
            saved[f"d={d} repeats={repeats}"] = 1 - o.expected_pairs / design.planned_pairs
    print(json.dumps({"expected_questions_saved": saved}))
    assert saved["d=0.05 repeats=1"] >= 0.10
    assert saved["d=0.05 repeats=3"] >= 0.45
