"""Early stop: the mixture SPRT stops a collapse within a few questions and never stops a clean run."""

from __future__ import annotations

import numpy as np

from pdcheck.analysis import SequentialTest, Verdict
from pdcheck.analysis.sequential import log_mixture_ratio, replay
from tests.unit.analysis.builders import side


def test_ratio_is_one_before_any_discordant_pair():
    """With no discordant pairs there is no evidence: log L = 0."""
    assert abs(float(log_mixture_ratio(0, 0))) < 1e-12


def test_collapse_stops_well_under_100_questions():
    """A 0.86 -> 0.11 collapse is called REGRESSION after fewer than 30 questions in every seed."""
    for seed in range(20):
        rng = np.random.default_rng(seed)
        t = SequentialTest(alpha=0.05, margin_pts=2.0)
        for _i in range(100):
            t.add(baseline_correct=bool(rng.random() < 0.86), pd_correct=bool(rng.random() < 0.11))
            if t.should_stop():
                break
        stop = t.should_stop()
        assert stop is not None and stop.verdict is Verdict.REGRESSION
        assert stop.n_pairs < 30, (seed, stop)


def test_stop_requires_the_margin():
    """Evidence alone does not stop when the observed drop is within the margin."""
    t = SequentialTest(alpha=0.05, margin_pts=50.0)
    for _ in range(30):
        t.add(baseline_correct=True, pd_correct=True)
    for _ in range(10):
        t.add(baseline_correct=True, pd_correct=False)
    assert float(log_mixture_ratio(t.worse, t.worse + t.better)) > t.threshold_log_ratio
    assert t.should_stop() is None  # a 25-point drop, below the 50-point margin


def test_the_first_decision_sticks():
    """Once stopped, later pairs do not undo the decision."""
    t = SequentialTest(alpha=0.05, margin_pts=2.0)
    for _ in range(12):
        t.add(baseline_correct=True, pd_correct=False)
    first = t.should_stop()
    for _ in range(200):
        t.add(baseline_correct=False, pd_correct=True)
    assert t.should_stop() == first


def test_replay_follows_file_order_and_skips_errors():
    """Replaying finished files feeds PD records in finish order and ignores failed requests."""
    base = side([True] * 100)
    pd = side([False] * 100)
    stop = replay(base, list(reversed(pd)), alpha=0.05, margin_pts=2.0)
    assert stop is not None and stop.n_pairs < 15
    assert replay(base, base, alpha=0.05, margin_pts=2.0) is None
