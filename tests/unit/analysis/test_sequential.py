"""Early stop: the group-sequential test stops a collapse early, stops clean cells for PASS, and
its early and final decisions are one test with one alpha."""

from __future__ import annotations

import numpy as np

from pdcheck.analysis import SequentialTest, Verdict
from pdcheck.analysis.design import Design
from pdcheck.analysis.sequential import sequential_result
from tests.unit.analysis.builders import record, side

GSM8K = 1319


def _design(n: int = GSM8K, *, family_size: int = 1, margin_pts: float = 2.0) -> Design:
    return Design.plan(
        n, alpha=0.05, margin_pts=margin_pts, family_size=family_size, early_stop=True
    )


def test_design_shares_sum_to_one_and_looks_are_increasing():
    """Bonferroni over the looks needs the shares to sum to 1; looks are fixed in advance."""
    for n in (10, 45, 61, 100, 500, GSM8K, 3 * GSM8K):
        d = _design(n)
        assert abs(sum(look.alpha_share for look in d.looks) - 1.0) < 1e-12
        pairs = [look.pairs for look in d.looks]
        assert pairs == sorted(set(pairs)) and pairs[-1] == n
    assert len(Design.plan(GSM8K, alpha=0.05, margin_pts=2.0).looks) == 1


def test_collapse_stops_within_60_pairs():
    """A 0.86 -> 0.11 collapse is REGRESSION at the 30- or 60-pair look in every seed."""
    for seed in range(20):
        rng = np.random.default_rng(seed)
        t = SequentialTest(_design())
        for _ in range(GSM8K):
            t.add(baseline_correct=bool(rng.random() < 0.86), pd_correct=bool(rng.random() < 0.11))
            if t.should_stop():
                break
        stop = t.should_stop()
        assert stop is not None and stop.verdict is Verdict.REGRESSION
        assert stop.n_pairs <= 60, (seed, stop)


def test_an_early_regression_is_certain_under_holm():
    """A REGRESSION stop means the sequential p is at most alpha / family size: Holm rejects it."""
    t = SequentialTest(_design(family_size=24))
    for _ in range(60):
        t.add(baseline_correct=True, pd_correct=False)
    result = t.result()
    assert result.stop is not None and result.stop.verdict is Verdict.REGRESSION
    assert result.sequential_p <= 0.05 / 24


def test_identical_sides_stop_for_pass_at_the_first_quarter():
    """No discordant pair in 330: the drop's upper bound is within the 2-pt margin, PASS is certain."""
    base = side([True] * GSM8K)
    result = sequential_result([(base, base)], _design())
    assert result.stop is not None and result.stop.verdict is Verdict.PASS
    assert result.stop.n_pairs == round(GSM8K / 4)
    assert result.within_margin


def test_a_drop_within_the_margin_by_estimate_is_not_stopped_for_pass():
    """At 60 pairs a 1-pt observed drop is no evidence of anything: no stop either way."""
    t = SequentialTest(_design())
    for i in range(60):
        t.add(baseline_correct=True, pd_correct=i != 0)
    assert t.should_stop() is None


def test_the_first_decision_sticks():
    """Once stopped, later pairs do not undo the decision."""
    t = SequentialTest(_design())
    for _ in range(30):
        t.add(baseline_correct=True, pd_correct=False)
    first = t.should_stop()
    assert first is not None
    for _ in range(200):
        t.add(baseline_correct=False, pd_correct=True)
    assert t.should_stop() == first


def test_result_without_a_stop_takes_the_final_look():
    """A run that never stopped is judged at its last pair with the final look's share."""
    t = SequentialTest(_design(200))
    for i in range(200):
        t.add(baseline_correct=True, pd_correct=i % 20 != 0)  # 5-pt drop, 10 PD-worse
    r = t.result()
    assert r.looks[-1].n_pairs == 200 and r.looks[-1].look == len(t.design.looks) - 1
    assert r.p_value == r.looks[-1].p_value


def test_repeats_pool_into_one_test():
    """Two repeats of 100 pairs are one stream of 200 pairs, not two tests."""
    base, pd = side([True] * 100), side([True] * 95 + [False] * 5)
    pooled = sequential_result([(base, pd), (base, pd)], _design(200))
    assert (pooled.n_pairs, pooled.worse) == (200, 10)


def test_replay_follows_file_order_and_skips_errors():
    """Replaying finished files feeds PD records in finish order and ignores failed requests."""
    base = side([True] * 100)
    pd = side([False] * 100)
    stop = sequential_result([(base, list(reversed(pd)))], _design(100)).stop
    assert stop is not None and stop.n_pairs == 30
    assert sequential_result([(base, base)], _design(100)).stop is None
    failed = [record(i, correct=False, ok=False) for i in range(100)]
    assert sequential_result([(base, failed)], _design(100)).n_pairs == 0
