"""Every shipped design, and 3 repeats of full GSM8K with early stop: at a true drop of exactly
the margin, the exact P(called within) ≤ alpha on a grid of discordances up to d = 1 (minutes
of lattice arithmetic, so here rather than in the unit tier; see its unit twin for the method)."""

from __future__ import annotations

import pytest

from pdcheck.analysis.design import Design
from pdcheck.evals.dataset import SYNTH_N_TEST
from tests.unit.analysis.test_margin_bound import SHIPPED, worst_called_within

DESIGNS = {
    **SHIPPED,
    "1319 x 3 pairs, early stop, 48 hypotheses": Design.plan(
        3 * SYNTH_N_TEST, alpha=0.05, margin_pts=2.0, family_size=48, early_stop=True
    ),
}


@pytest.mark.parametrize("name", sorted(DESIGNS))
def test_a_drop_of_the_margin_is_called_within_at_most_alpha_up_to_d_1(name):
    """Exact P(called within | drop = margin) ≤ alpha for d from the margin to 1."""
    design = DESIGNS[name]
    worst = worst_called_within(design, (0.05, 0.1, 0.2, 0.4, 0.7, 1.0))
    print(f"{name}: worst P(called within | drop = margin) = {worst:.5f}, alpha {design.alpha}")
    assert worst <= design.alpha, (name, worst)
