"""The gate's error rates, by exact computation and by Monte Carlo through the code the run uses.

Settings are those of `default-gpu`: 24 clean tests (8 clean cells × 3 concurrency levels),
full GSM8K (n = 1319 per repeat), alpha 0.05, margin 2 points. d is the discordance, the share
of questions PD and the baseline answer differently. Exact figures come from
`power.operating` (the design's law carried look to look); Monte Carlo runs simulated sweeps
through `Design` and `decide_family`. Run with `-s` to print the numbers quoted in
docs/analysis.md and docs/notes/issue-17.md.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from pdcheck.analysis import Verdict, compare_paired, decide
from pdcheck.analysis.design import Design
from pdcheck.analysis.family import FamilyMember, decide_family
from pdcheck.analysis.power import drop_probabilities, operating
from pdcheck.analysis.sequential import SequentialTest
from pdcheck.analysis.stats import mcnemar_worse_p
from pdcheck.config import AnalysisPolicy
from tests.unit.analysis.builders import paired_sides

ALPHA = 0.05
MARGIN_PTS = 2.0
N = 1319
FAMILY = 24
DISCORDANCES = (0.02, 0.05, 0.15, 0.40)


def _design(repeats: int, early_stop: bool, family_size: int = FAMILY) -> Design:
    return Design.plan(
        N * repeats,
        alpha=ALPHA,
        margin_pts=MARGIN_PTS,
        family_size=family_size,
        early_stop=early_stop,
    )


@pytest.mark.parametrize("early_stop", [False, True])
@pytest.mark.parametrize("repeats", [1, 3])
def test_clean_sweep_fails_at_most_alpha_exactly(repeats, early_stop):
    """24 independent clean tests: P(the sweep flags anything) ≤ alpha at every d (exact)."""
    design = _design(repeats, early_stop)
    rates = {}
    for d in DISCORDANCES:
        q = operating(design, p_worse=d / 2, p_better=d / 2).flag
        rates[d] = 1 - (1 - q) ** FAMILY
    print(json.dumps({"repeats": repeats, "early_stop": early_stop, "clean_sweep_fails": rates}))
    assert max(rates.values()) <= ALPHA


def _simulate(rng, design: Design, p_worse, p_better, sims: int):
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


def _flagged(seq_p, within_last) -> np.ndarray:
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


@pytest.mark.parametrize("early_stop", [False, True])
def test_clean_sweep_fails_at_most_alpha_monte_carlo(early_stop):
    """3,000 simulated clean sweeps per d through the run's code: fail rate ≤ alpha + 3 MC s.e."""
    rng = np.random.default_rng(17)
    sims = 3000
    rates = {}
    for d in DISCORDANCES:
        seq_p, within, _ = _simulate(
            rng, _design(1, early_stop), [d / 2] * FAMILY, [d / 2] * FAMILY, sims
        )
        rates[d] = float(_flagged(seq_p, within).any(axis=1).mean())
    print(json.dumps({"early_stop": early_stop, "monte_carlo_clean_sweep_fails": rates}))
    se = (ALPHA * (1 - ALPHA) / sims) ** 0.5
    assert max(rates.values()) <= ALPHA + 3 * se


@pytest.mark.parametrize("early_stop", [False, True])
def test_three_point_drop_is_flagged_90_percent_at_d_5(early_stop):
    """n = 1319, d = 5% (the disagreement of the run with the drop in it), one cell of 24 drops
    3 points: it is flagged ≥ 90% (exact at alpha/24, and by Monte Carlo through Holm)."""
    design = _design(1, early_stop)
    p_worse, p_better = drop_probabilities(0.05, 0.03)
    exact = operating(design, p_worse=p_worse, p_better=p_better).flag
    rng = np.random.default_rng(3)
    pw = [p_worse] + [0.025] * (FAMILY - 1)
    pb = [p_better] + [0.025] * (FAMILY - 1)
    seq_p, within, _ = _simulate(rng, design, pw, pb, 2000)
    mc = float(_flagged(seq_p, within)[:, 0].mean())
    print(json.dumps({"early_stop": early_stop, "power_3pt_d5_exact": exact, "monte_carlo": mc}))
    assert exact >= 0.90
    assert mc >= 0.90 - 3 * (0.9 * 0.1 / 2000) ** 0.5


def test_forty_point_collapse_stops_within_60_questions():
    """A 40-point drop (42.5% of pairs PD-worse, 2.5% PD-better: d = 45%) is stopped at the 30-
    or 60-pair look ≥ 95% of the time even at alpha/24; a lone test (a canary, `compare`) does so
    even with independent sides."""
    clean = _design(1, True)
    lone = _design(1, True, family_size=1)
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
            design = _design(repeats, True)
            o = operating(design, p_worse=d / 2, p_better=d / 2)
            saved[f"d={d} repeats={repeats}"] = 1 - o.expected_pairs / design.planned_pairs
    print(json.dumps({"expected_questions_saved": saved}))
    assert saved["d=0.05 repeats=1"] >= 0.10
    assert saved["d=0.05 repeats=3"] >= 0.45


def test_monte_carlo_follows_the_exact_law():
    """The simulation's pairs used and the exact expected pairs agree (checks both)."""
    design = _design(1, True)
    rng = np.random.default_rng(11)
    _, _, used = _simulate(rng, design, [0.025], [0.025], 4000)
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
