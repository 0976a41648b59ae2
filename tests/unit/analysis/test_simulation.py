"""The gate's error rates, by exact computation and by Monte Carlo through the code the run uses.

Settings are those of `default-gpu`: 24 clean tests (8 clean cells × 3 concurrency levels),
full GSM8K (n = 1319 per repeat), alpha 0.05, margin 2 points. d is the discordance, the share
of questions PD and the baseline answer differently. Exact figures come from
`power.operating` (the design's law carried look to look); Monte Carlo runs simulated sweeps
through `Design` and `decide_family`. Run with `-s` to print the numbers quoted in
docs/analysis.md and docs/notes/issue-17.md. The bars that take seconds of CPU each (the false
alarm rate, exact and by Monte Carlo, the 3-point power, the 40-point collapse, the questions early stop saves) are in
tests/slow/test_simulation_heavy.py, on this module's helpers.
"""

from __future__ import annotations

import numpy as np

from pdcheck.analysis import Verdict, compare_paired, decide
from pdcheck.analysis.design import Design
from pdcheck.analysis.family import FamilyMember, decide_family
from pdcheck.analysis.power import operating
from pdcheck.analysis.sequential import SequentialTest
from pdcheck.analysis.stats import mcnemar_worse_p
from pdcheck.config import AnalysisPolicy
from tests.unit.analysis.builders import paired_sides

ALPHA = 0.05
MARGIN_PTS = 2.0
N = 1319
FAMILY = 24
DISCORDANCES = (0.02, 0.05, 0.15, 0.40)


def plan_design(repeats: int, early_stop: bool, family_size: int = FAMILY) -> Design:
    return Design.plan(
        N * repeats,
        alpha=ALPHA,
        margin_pts=MARGIN_PTS,
        family_size=family_size,
        early_stop=early_stop,
    )


def simulate(rng, design: Design, p_worse, p_better, sims: int):
    """Sweeps of len(p_worse) tests through the design's looks; per test its sequential p,
    whether its last look showed the margin, and the pairs it used."""
    tests = len(p_worse)
    probs = np.stack([p_worse, p_better, 1 - np.add(p_worse, p_better)], axis=-1)
    worse = np.zeros((sims, tests), dtype=np.int64)
    better = np.zeros_like(worse)
    alive = np.ones((sims, tests), dtype=bool)
    seq_p = np.ones((sims, tests))
    within_last = np.zeros((sims, tests), dtype=bool)
    used = np.full((sims, tests), design.planned_pairs)
    done = 0
    for k, look in enumerate(design.looks):
        inc = rng.multinomial(look.pairs - done, probs, size=(sims, tests))
        done = look.pairs
        worse = np.where(alive, worse + inc[..., 0], worse)
        better = np.where(alive, better + inc[..., 1], better)
        within = design.within_margin(worse, better, look.pairs)
        ratio = np.where(within, 1.0, mcnemar_worse_p(worse, better) / look.alpha_share)
        seq_p = np.where(alive, np.minimum(seq_p, ratio), seq_p)
        within_last = np.where(alive, within, within_last)
        if k < len(design.looks) - 1:
            stop = alive & (
                design.rejects(k, worse, better, look.pairs, within=within)
                | (within & look.equivalence)
            )
            used = np.where(stop, look.pairs, used)
            alive &= ~stop
    return seq_p, within_last, used


def flagged(seq_p, within_last) -> np.ndarray:
    """The run's decision (Holm, `decide_family`) per simulated sweep; a sweep whose smallest
    sequential p is above alpha / F cannot flag anything and is skipped."""
    flags = np.zeros(seq_p.shape, dtype=bool)
    for s in np.flatnonzero(seq_p.min(axis=1) <= ALPHA / seq_p.shape[1]):
        members = [
            FamilyMember(key=str(t), p_value=1.0, sequential_p=float(p), within_margin=bool(w))
            for t, (p, w) in enumerate(zip(seq_p[s], within_last[s], strict=True))
        ]
        flags[s] = [v.flagged for v in decide_family(members, alpha=ALPHA)]
    return flags


def test_monte_carlo_follows_the_exact_law():
    """The simulation's pairs used and the exact expected pairs agree (checks both)."""
    design = plan_design(1, True)
    rng = np.random.default_rng(11)
    _, _, used = simulate(rng, design, [0.025], [0.025], 4000)
    exact = operating(design, p_worse=0.025, p_better=0.025).expected_pairs
    assert abs(used.mean() - exact) < 0.02 * exact


def test_vectorised_design_matches_the_live_test():
    """SequentialTest fed pair by pair stops where the vectorised design says, with the same p."""
    rng = np.random.default_rng(5)
    design = Design.plan(400, alpha=ALPHA, margin_pts=MARGIN_PTS, family_size=4, early_stop=True)
    for _ in range(60):
        pw, pb = rng.uniform(0, 0.2), rng.uniform(0, 0.1)
        outcome = rng.choice(3, size=400, p=[pw, pb, 1 - pw - pb])
        t = SequentialTest(design)
        for o in outcome:
            t.add(baseline_correct=o != 1, pd_correct=o != 0)
        result = t.result()
        seq_p, within, used = _simulate_fixed(design, outcome)
        assert result.n_pairs == used
        assert abs(result.sequential_p - seq_p) < 1e-12
        assert result.within_margin == within


def _simulate_fixed(design: Design, outcome: np.ndarray):
    worse_c = np.cumsum(outcome == 0)
    better_c = np.cumsum(outcome == 1)
    seq_p, within = 1.0, False
    for k, look in enumerate(design.looks):
        w, b = int(worse_c[look.pairs - 1]), int(better_c[look.pairs - 1])
        within = bool(design.within_margin(w, b, look.pairs))
        if not within:
            seq_p = min(seq_p, float(mcnemar_worse_p(w, b)) / look.alpha_share)
        if k < len(design.looks) - 1 and (
            bool(design.rejects(k, w, b, look.pairs)) or (within and look.equivalence)
        ):
            return seq_p, within, look.pairs
    return seq_p, within, design.planned_pairs


def test_decide_on_records_matches_the_rule():
    """`decide` on real records flags exactly when the one-look design rejects."""
    rng = np.random.default_rng(5)
    for _ in range(40):
        n = int(rng.integers(50, 400))
        worse, better = (int(x) for x in rng.multinomial(n, [0.07, 0.03, 0.9])[:2])
        base, pd = paired_sides(both=n - worse - better, worse=worse, better=better, neither=0)
        v = decide(
            compare_paired(base, pd), policy=AnalysisPolicy(margin_pts=MARGIN_PTS, alpha=ALPHA)
        )
        design = Design.plan(n, alpha=ALPHA, margin_pts=MARGIN_PTS)
        expected = bool(design.rejects(0, worse, better, n))
        assert (v.verdict is Verdict.REGRESSION) == expected, (n, worse, better, v)
