"""Paired comparison: pairing by index, errors kept apart, Tango/McNemar numbers, jitter, compatibility."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pdcheck.analysis import Verdict, compare_paired, decide
from pdcheck.analysis.stats import fisher_greater_p, mcnemar_worse_p, tango_interval
from pdcheck.config import AnalysisPolicy
from pdcheck.errors import ConfigError
from tests.unit.analysis.builders import json_round_trip, paired_sides, record, side


def test_pairs_by_index_not_by_position():
    """Shuffling one side's file order must not change any number: records pair by question index."""
    base, pd = paired_sides(both=50, worse=8, better=2, neither=40)
    shuffled = list(reversed(pd))
    assert compare_paired(base, pd) == compare_paired(base, shuffled)


def test_different_index_sets_raise_a_value_error_naming_them():
    """Sides over different questions are bad input (ConfigError, a ValueError), never silently zipped."""
    base = side([True, False, True])
    pd = side([True, False, True], start=1)
    with pytest.raises(ValueError, match=r"different questions.*only in baseline"):
        compare_paired(base, pd)
    with pytest.raises(ConfigError):
        compare_paired(base, pd)


def test_duplicate_index_is_rejected():
    """A file holding one question twice cannot be paired and says which index."""
    base = side([True, True])
    with pytest.raises(ConfigError, match="index 1 twice"):
        compare_paired([*base, record(1, correct=False)], [*base, record(2, correct=True)])


def test_errors_are_counted_apart_and_leave_the_pairs():
    """A failed request is not a wrong answer: it is counted per side and excluded from the accuracy pairs."""
    base = side([True] * 10)
    pd = [record(i, correct=True, ok=i >= 3) for i in range(10)]
    c = compare_paired(base, pd)
    assert (c.pd.n_errors, c.baseline.n_errors) == (3, 0)
    assert c.n_pairs == 7
    assert c.worse == 0 and c.delta_pts == 0.0
    assert c.pd.accuracy == 1.0


def test_counts_delta_and_one_sided_p():
    """Δ is (better − worse)/n in points, and p is the exact one-sided binomial tail of the PD-worse pairs."""
    base, pd = paired_sides(both=80, worse=9, better=1, neither=10)
    c = compare_paired(base, pd)
    assert (c.worse, c.better, c.n_pairs) == (9, 1, 100)
    assert c.delta_pts == pytest.approx(-8.0)
    # P(Binom(10, 1/2) >= 9) = 11/1024
    assert c.p_value == pytest.approx(11 / 1024)
    assert c.ci_low_pts < -8.0 < c.ci_high_pts < 0


def test_mcnemar_is_one_sided():
    """PD answering more questions right is not evidence of a regression: p is large then."""
    assert float(mcnemar_worse_p(1, 9)) > 0.99
    assert float(mcnemar_worse_p(0, 0)) == 1.0


def test_tango_interval_with_no_discordant_pairs_is_finite_and_contains_zero():
    """Zero discordant pairs (a perfect PD) still gives an interval of width > 0 (Wald would give [0, 0])."""
    lo, hi = tango_interval(0, 0, 100)
    z2 = 1.959963984540054**2
    assert lo == pytest.approx(-z2 / (100 + z2), rel=1e-6)
    assert hi == pytest.approx(z2 / (100 + z2), rel=1e-6)


def test_tango_interval_covers_at_its_level():
    """Tango's 95% interval covers the true Δ about 95% of the time, also at low discordance."""
    rng = np.random.default_rng(7)
    n, p_worse, p_better = 200, 0.04, 0.01
    hits = 0
    trials = 400
    for _ in range(trials):
        w, b, _ = rng.multinomial(n, [p_worse, p_better, 1 - p_worse - p_better])
        lo, hi = tango_interval(int(w), int(b), n)
        hits += lo <= p_better - p_worse <= hi
    assert 0.92 <= hits / trials <= 0.99


def test_invalid_rate_delta_counts_newly_invalid_as_worse():
    """Δinvalid is PD − baseline, so PD turning valid answers invalid makes it positive."""
    base = [record(i, correct=False) for i in range(20)]
    pd = [record(i, correct=False, invalid=i < 5) for i in range(20)]
    c = compare_paired(base, pd)
    assert c.invalid_worse == 5
    assert c.delta_invalid_pts == pytest.approx(25.0)
    assert c.invalid_ci_low_pts > 0


def test_jitter_reports_mean_and_std_per_side():
    """With repeated runs, each side's run accuracies, mean and std (vLLM's 5-run table) are reported."""
    base = side([True] * 8 + [False] * 2)
    rep = side([True] * 6 + [False] * 4)
    c = compare_paired(base, base, baseline_repeats=[rep], pd_repeats=[rep])
    assert c.jitter.baseline_runs == (0.8, 0.6)
    assert c.jitter.baseline_mean == pytest.approx(0.7)
    assert c.jitter.baseline_std == pytest.approx(np.std([0.8, 0.6], ddof=1))
    assert c.jitter.pd_std == pytest.approx(c.jitter.baseline_std)


def test_compatibility_check_is_vllms_gate():
    """|acc − expected| < rtol is reported as vLLM computes it."""
    base, pd = paired_sides(both=70, worse=5, better=0, neither=25)
    c = compare_paired(base, pd, expected_accuracy=0.80, expected_rtol=0.05)
    assert c.compatibility.pd_accuracy == pytest.approx(0.70)
    assert c.compatibility.passed is False
    assert compare_paired(base, pd, expected_accuracy=0.72).compatibility.passed is True


def test_fisher_one_sided():
    """More divergences in the test group than the control gives a small p; fewer gives p near 1."""
    assert fisher_greater_p(20, 200, 2, 200) < 0.001
    assert fisher_greater_p(2, 200, 20, 200) > 0.99
    assert fisher_greater_p(0, 0, 1, 10) == 1.0


def test_comparison_round_trips_through_json():
    """The sweep stores comparisons as JSON and the report reads them back unchanged."""
    base = [record(i, correct=i % 3 > 0, margins=[1.0, 0.01, 1.0]) for i in range(30)]
    pd = [
        record(i, correct=i % 4 > 0, token_ids=(1, 2, 9) if i % 5 == 0 else (1, 2, 3))
        for i in range(30)
    ]
    c = compare_paired(base, pd, baseline_repeats=[base], expected_accuracy=0.7)
    again = json_round_trip(c)
    assert again == c


@settings(max_examples=200, deadline=None)
@given(
    st.integers(1, 2000)
    .flatmap(lambda n: st.tuples(st.just(n), st.integers(0, n)))
    .flatmap(lambda t: st.tuples(st.just(t[0]), st.just(t[1]), st.integers(0, t[0] - t[1])))
)
def test_tango_interval_is_ordered_bounded_and_contains_the_estimate(case):
    """For any counts the interval lies in [-1, 1], is ordered, and contains (better - worse)/n."""
    n, worse, better = case
    lo, hi = tango_interval(worse, better, n)
    est = (better - worse) / n
    assert -1.0 <= lo <= est + 1e-9 and est - 1e-9 <= hi <= 1.0


def test_request_errors_are_counted_over_every_repeat():
    """52% of PD's repeat-1 requests failing makes the cell INFRA-ERROR, and the reason counts
    them (issue 30: only repeat 0 was read, and the reason said "0 failed requests")."""
    base = side([True] * 100)
    failing = [record(i, correct=True, ok=i >= 52) for i in range(100)]
    c = compare_paired(base, base, baseline_repeats=[base], pd_repeats=[failing])
    assert (c.pd.n_records, c.pd.n_errors) == (200, 52)
    v = decide(c, policy=AnalysisPolicy())
    assert v.verdict is Verdict.INFRA_ERROR and "52/200 failed requests" in v.reason
