"""Verdicts: each rule fires on its own evidence, in order, with a one-line reason and its numbers."""

from __future__ import annotations

import pytest

from pdcheck.analysis import (
    CanaryStatus,
    Status,
    Verdict,
    canary_status,
    compare_paired,
    decide,
    judge,
)
from pdcheck.analysis.verdict import run_exit_code
from pdcheck.config import AnalysisPolicy
from pdcheck.errors import ExitCode
from tests.unit.analysis.builders import json_round_trip, paired_sides, record, side

POLICY = AnalysisPolicy()


def test_verdict_values_are_exactly_the_contract():
    """The store and the report spell verdicts exactly so; INFRA_ERROR's value has a hyphen."""
    assert [v.value for v in Verdict] == [
        "PASS",
        "REGRESSION",
        "SUSPECT",
        "INCONCLUSIVE",
        "INFRA-ERROR",
        "NO-DROP-SHOWN",
    ]


def test_large_significant_drop_is_a_regression():
    """A significant drop beyond the margin is REGRESSION, and the reason cites Δ, p and the margin."""
    base, pd = paired_sides(both=700, worse=80, better=20, neither=200)
    v = decide(compare_paired(base, pd), policy=POLICY)
    assert v.verdict is Verdict.REGRESSION
    assert v.delta_pts == pytest.approx(-6.0)
    assert "p=" in v.reason and "margin" in v.reason and "\n" not in v.reason


def test_significant_drop_within_the_margin_passes():
    """Tiny significant differences on a huge n do not fail: the drop must exceed the margin."""
    base, pd = paired_sides(both=15000, worse=150, better=20, neither=5000)
    c = compare_paired(base, pd)
    assert c.p_value < 0.05 and c.delta_pts > -2.0
    assert decide(c, policy=POLICY).verdict is Verdict.PASS


def test_large_noisy_drop_on_small_n_does_not_fail():
    """A big observed drop that is not significant (tiny n) is never REGRESSION."""
    base, pd = paired_sides(both=6, worse=2, better=0, neither=2)
    v = decide(compare_paired(base, pd), policy=POLICY)
    assert v.verdict is Verdict.INCONCLUSIVE
    assert v.n_needed is not None and v.n_needed > 10
    assert "needs about n ≥" in v.reason


def test_well_powered_clean_run_passes():
    """No drop, enough questions: PASS with its MDE below the margin."""
    base, pd = paired_sides(both=1000, worse=10, better=10, neither=300)
    v = decide(compare_paired(base, pd), policy=POLICY)
    assert v.verdict is Verdict.PASS
    assert v.mde_pts < POLICY.margin_pts


def test_infra_error_cases():
    """Servers failed, no KV transferred, too many request errors, or no pairs: INFRA-ERROR, never PASS."""
    base, pd = paired_sides(both=1000, worse=10, better=10, neither=300)
    c = compare_paired(base, pd)
    assert decide(c, policy=POLICY, infra_error="decoder exited 1").verdict is Verdict.INFRA_ERROR
    v = decide(c, policy=POLICY, kv_transferred_tokens=0)
    assert v.verdict is Verdict.INFRA_ERROR and "no KV" in v.reason
    assert decide(c, policy=POLICY, kv_transferred_tokens=1234).verdict is Verdict.PASS
    failing = [record(i, correct=True, ok=i % 10 != 0) for i in range(100)]
    v = decide(compare_paired(side([True] * 100), failing), policy=POLICY)
    assert v.verdict is Verdict.INFRA_ERROR and "10/100 failed" in v.reason
    assert decide(compare_paired([], []), policy=POLICY).verdict is Verdict.INFRA_ERROR


def test_corruption_beyond_the_control_is_suspect_without_accuracy_drop():
    """The full-attention block-reuse shape: accuracy unchanged, corruption-grade flips beyond the control."""
    base = [
        record(i, correct=i % 5 > 0, token_ids=(1, 2, 3), margins=[2.0, 2.0, 2.0])
        for i in range(1319)
    ]
    pd = [
        record(i, correct=i % 5 > 0, token_ids=(1, 9, 3) if i % 20 == 0 else (1, 2, 3))
        for i in range(1319)
    ]
    v = decide(compare_paired(base, pd, baseline_repeats=[base]), policy=POLICY)
    assert v.verdict is Verdict.SUSPECT
    assert v.delta_pts == 0.0 and v.suspect_p_value < 0.05


def test_no_control_means_no_suspect():
    """Without a control there is nothing to compare divergences with, so agreement alone cannot flag."""
    base = [
        record(i, correct=i % 5 > 0, token_ids=(1, 2, 3), margins=[2.0, 2.0, 2.0])
        for i in range(1319)
    ]
    pd = [
        record(i, correct=i % 5 > 0, token_ids=(1, 9, 3) if i % 20 == 0 else (1, 2, 3))
        for i in range(1319)
    ]
    assert decide(compare_paired(base, pd), policy=POLICY).verdict is Verdict.PASS


def test_run_to_run_jitter_never_widens_the_margin():
    """A noisy repeated baseline leaves the margin at the policy's: a significant drop that is not
    bounded within it stays a REGRESSION (the old noise floor made it about 8 points)."""
    base, pd = paired_sides(both=700, worse=50, better=10, neither=240)
    noisy = side([True] * 800 + [False] * 200)  # 80% against 75%: a run-to-run std of 3.5 pts
    v = decide(compare_paired(base, pd, baseline_repeats=[noisy]), policy=POLICY)
    assert v.effective_margin_pts == v.margin_pts == POLICY.margin_pts
    assert v.verdict is Verdict.REGRESSION


def test_exit_codes():
    """0 PASS/INCONCLUSIVE, 1 REGRESSION/SUSPECT, 2 INFRA-ERROR."""
    assert Verdict.PASS.exit_code == ExitCode.OK
    assert Verdict.INCONCLUSIVE.exit_code == ExitCode.OK
    assert Verdict.REGRESSION.exit_code == Verdict.SUSPECT.exit_code == ExitCode.FAILED
    assert Verdict.INFRA_ERROR.exit_code == ExitCode.INFRA


def test_canary_rule():
    """A canary must be flagged; PASS (or too small to tell) means the suite lost its detection power."""
    assert canary_status(Verdict.REGRESSION) is CanaryStatus.OK
    assert canary_status(Verdict.SUSPECT) is CanaryStatus.OK
    assert canary_status(Verdict.PASS) is CanaryStatus.FAILED
    assert canary_status(Verdict.INCONCLUSIVE) is CanaryStatus.FAILED
    assert canary_status(Verdict.INFRA_ERROR) is CanaryStatus.UNKNOWN


def test_verdict_round_trips_through_json():
    """CellVerdict survives the store: the enum comes back as a Verdict."""
    base, pd = paired_sides(both=700, worse=80, better=20, neither=200)
    v = decide(compare_paired(base, pd), policy=POLICY, kv_transferred_tokens=99)
    again = json_round_trip(v)
    assert again == v and again.verdict is Verdict.REGRESSION


def test_divergences_without_logprobs_are_reported_not_judged():
    """Without margins a near-tie flip looks like corruption, so many divergences alone never make SUSPECT."""
    base = [record(i, correct=i % 5 > 0) for i in range(1319)]
    pd = [
        record(i, correct=i % 5 > 0, token_ids=(1, 9, 3) if i % 20 == 0 else (1, 2, 3))
        for i in range(1319)
    ]
    c = compare_paired(base, pd, baseline_repeats=[base])
    assert c.control.basis == "any-divergence" and c.control.p_value < 0.05
    v = decide(c, policy=POLICY)
    assert v.verdict is Verdict.PASS and v.suspect_p_value is None


@pytest.mark.parametrize(
    ("verdict", "canary", "status"),
    [
        (Verdict.PASS, False, Status.PASS),
        (Verdict.REGRESSION, False, Status.FAIL),
        (Verdict.SUSPECT, False, Status.FAIL),
        (Verdict.INCONCLUSIVE, False, Status.FAIL),
        (Verdict.INFRA_ERROR, False, Status.INFRA),
        (Verdict.REGRESSION, True, Status.PASS),
        (Verdict.SUSPECT, True, Status.PASS),
        (Verdict.PASS, True, Status.FAIL),
        (Verdict.INCONCLUSIVE, True, Status.FAIL),
        (Verdict.INFRA_ERROR, True, Status.INFRA),
    ],
)
def test_judge_applies_the_canary_logic(verdict, canary, status):
    """A flagged canary passes; a canary that is not flagged fails; infra stays infra."""
    outcome = judge(verdict, "r", canary=canary)
    assert outcome.status is status and outcome.verdict is verdict and outcome.canary is canary
    if canary and status is Status.FAIL:
        assert outcome.reason.startswith(f"canary NOT flagged ({verdict})")


def test_inconclusive_fails_the_gate_unless_the_policy_allows_it():
    """A clean INCONCLUSIVE fails (we could not tell) unless allowed; a canary's fails either way."""
    failed = judge(Verdict.INCONCLUSIVE, "r", canary=False)
    assert failed.status is Status.FAIL and "we could not tell" in failed.reason
    allowed = judge(Verdict.INCONCLUSIVE, "r", canary=False, allow_inconclusive=True)
    assert allowed.status is Status.INCONCLUSIVE
    canary = judge(Verdict.INCONCLUSIVE, "r", canary=True, allow_inconclusive=True)
    assert canary.status is Status.FAIL


def test_a_run_fails_before_it_is_infra():
    """1 beats 2: a real failure is the bigger news; 2 only when nothing failed but infra did."""
    assert run_exit_code([Status.PASS, Status.INFRA, Status.FAIL]) is ExitCode.FAILED
    assert run_exit_code([Status.INCONCLUSIVE, Status.INFRA]) is ExitCode.INFRA
    assert run_exit_code([Status.PASS, Status.INCONCLUSIVE]) is ExitCode.OK
    assert run_exit_code([]) is ExitCode.OK
