"""Every PASS is bounded, by seeded simulation through `decide` itself (issue 42): at a true
drop equal to the margin, a clean level of each shipped sweep's design PASSes at most alpha of
the time (the unit twin, tests/unit/analysis/test_pass_bound.py, computes the bound exactly).

Pairs are i.i.d. at discordance d = 10% with a drop of the margin; each simulated level runs
its design's looks (`SequentialTest`, early stop included), gets its lone call at alpha / F
(`decide_alone`, Holm's first step) and its verdict from `decide`. `-s` prints the rates.
"""

from __future__ import annotations

import math
from collections import Counter

import numpy as np
import pytest

from pdcheck.analysis import verdict as verdict_rules
from pdcheck.analysis.family import FamilyMember, decide_alone
from pdcheck.analysis.paired import compare_paired
from pdcheck.analysis.power import drop_probabilities
from pdcheck.analysis.sequential import SequentialTest
from pdcheck.analysis.verdict import LevelEvidence, Verdict, decide
from pdcheck.config import AnalysisPolicy
from pdcheck.config.load import shipped_sweep_names
from tests.unit.analysis.builders import paired_sides
from tests.unit.analysis.test_pass_bound import _designs

DRAWS = 400
DISCORDANCE = 0.10


def _level(design, rng, p_worse, p_better):
    test = SequentialTest(design)
    outcome = rng.choice(
        3, size=design.planned_pairs, p=[p_worse, p_better, 1 - p_worse - p_better]
    )
    for o in outcome:
        test.add(baseline_correct=o != 1, pd_correct=o != 0)  # 0 PD-worse, 1 PD-better
        if test.should_stop() is not None:
            break
    r = test.result()
    member = FamilyMember(
        key="t", p_value=r.p_value, sequential_p=r.sequential_p, within_margin=r.within_margin
    )
    return verdict_rules.TestDecision(
        design=design,
        member=member,
        family=decide_alone(member, alpha=design.alpha, family_size=design.family_size),
        early_stop=r.stop.reason if r.stop is not None else None,
        worse=r.worse,
        better=r.better,
        n_pairs=r.n_pairs,
    )


@pytest.mark.parametrize("name", shipped_sweep_names())
def test_a_drop_of_the_margin_passes_at_most_alpha_of_the_time_through_decide(name):
    """P(PASS | drop = margin, d = 10%) ≤ alpha + 3 standard errors, for each clean design."""
    rng = np.random.default_rng(42)
    for design, alpha in _designs(name):
        drop = design.margin_pts / 100
        p_worse, p_better = drop_probabilities(max(DISCORDANCE, drop), drop)
        # The verdict reads its counts from the decision; the comparison only says the sides
        # answered (no request errors) and the baseline's accuracy.
        n = design.planned_pairs
        comparison = compare_paired(*paired_sides(both=n - 100, worse=0, better=0, neither=100))
        policy = AnalysisPolicy(alpha=alpha, margin_pts=design.margin_pts)
        verdicts = [
            decide(
                LevelEvidence(
                    comparison=comparison, decision=_level(design, rng, p_worse, p_better)
                ),
                policy=policy,
            ).verdict
            for _ in range(DRAWS)
        ]
        rate = sum(v is Verdict.PASS for v in verdicts) / DRAWS
        counts = {str(v): k for v, k in sorted(Counter(verdicts).items())}
        print(f"{name} n={n}: P(PASS) = {rate:.3f} of {DRAWS}, verdicts {counts}")
        assert rate <= alpha + 3 * math.sqrt(alpha * (1 - alpha) / DRAWS), (name, n, rate)
