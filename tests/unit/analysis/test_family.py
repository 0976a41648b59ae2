"""The run's decision (Holm across clean tests, canaries alone) and the verdict rules around it."""

from __future__ import annotations

import numpy as np

from pdcheck.analysis import Verdict, compare_paired, decide
from pdcheck.analysis import verdict as verdict_rules
from pdcheck.analysis.design import Design
from pdcheck.analysis.family import FamilyMember, decide_alone, decide_family, holm_adjust
from pdcheck.analysis.sequential import sequential_result
from pdcheck.analysis.stats import drop_bounds, mcnemar_worse_p
from pdcheck.analysis.verdict import gate_exit_code
from pdcheck.config import AnalysisPolicy
from pdcheck.errors import ExitCode
from tests.unit.analysis.builders import paired_sides, record, side

POLICY = AnalysisPolicy()


def test_holm_adjusted_p_values():
    """Holm's adjusted p: sorted, multiplied by (F - rank), made monotone, capped at 1."""
    assert holm_adjust([0.01, 0.04, 0.03, 0.5]) == (0.04, 0.09, 0.09, 0.5)
    assert holm_adjust([0.3, 0.4]) == (0.6, 0.6)
    assert holm_adjust([]) == ()


def test_clean_tests_share_alpha_and_canaries_do_not():
    """A p of 0.01 fails alone but not among 24 clean tests; a canary is judged on its own."""
    members = [
        FamilyMember(key=f"c{i}", p_value=0.5, sequential_p=0.5, within_margin=False)
        for i in range(23)
    ]
    members.append(FamilyMember(key="x", p_value=0.01, sequential_p=0.01, within_margin=False))
    members.append(
        FamilyMember(
            key="canary", p_value=0.01, sequential_p=0.01, within_margin=False, canary=True
        )
    )
    verdicts = {v.key: v for v in decide_family(members, alpha=0.05)}
    assert not verdicts["x"].flagged and verdicts["x"].adjusted_p == 0.24
    assert verdicts["x"].family_size == 24
    assert verdicts["canary"].flagged and verdicts["canary"].family_size == 1
    assert verdicts["canary"].adjusted_p == 0.01


def test_a_drop_shown_within_the_margin_is_not_flagged():
    """A tiny significant drop whose bound is within the margin passes (the margin's purpose)."""
    (v,) = decide_family(
        [FamilyMember(key="a", p_value=1e-9, sequential_p=1e-9, within_margin=True)], alpha=0.05
    )
    assert not v.flagged


def test_request_errors_that_could_hide_a_drop_make_the_cell_inconclusive():
    """65 of 1319 PD requests fail exactly where the baseline was right: scored as wrong they
    would be a 4.9-point REGRESSION, so the cell is INCONCLUSIVE, not PASS with Δ 0."""
    base, pd = paired_sides(both=1000, worse=10, better=10, neither=299)
    failed = {r.index for r in base if r.correct}
    hidden = sorted(failed)[:65]
    pd = [record(r.index, correct=False, ok=False) if r.index in hidden else r for r in pd]
    v = decide(compare_paired(base, pd), policy=POLICY)
    assert v.verdict is Verdict.INCONCLUSIVE, v.reason
    assert "request errors could hide a drop" in v.reason
    # The same errors where the baseline was wrong too cannot hide a drop.
    wrong = [r.index for r in base if not r.correct][:65]
    pd2 = [
        record(r.index, correct=False, ok=False) if r.index in wrong else r
        for r in paired_sides(both=1000, worse=10, better=10, neither=299)[1]
    ]
    assert decide(compare_paired(base, pd2), policy=POLICY).verdict is Verdict.PASS


def test_all_wrong_on_both_sides_is_inconclusive():
    """A baseline that answers nothing right cannot lose 3 points: we could not tell, not PASS."""
    base, pd = paired_sides(both=0, worse=0, better=0, neither=1319)
    v = decide(compare_paired(base, pd), policy=POLICY)
    assert v.verdict is Verdict.INCONCLUSIVE and "cannot lose" in v.reason


def test_inconclusive_fails_the_gate_unless_allowed():
    assert gate_exit_code(Verdict.INCONCLUSIVE, allow_inconclusive=False) is ExitCode.FAILED
    assert gate_exit_code(Verdict.INCONCLUSIVE, allow_inconclusive=True) is ExitCode.OK
    assert gate_exit_code(Verdict.PASS, allow_inconclusive=False) is ExitCode.OK
    assert gate_exit_code(Verdict.REGRESSION, allow_inconclusive=True) is ExitCode.FAILED


def test_interval_agrees_with_the_test():
    """The 1 - 2 alpha interval excludes 0 exactly when the one-sided test rejects at alpha
    (issue 30: W = 4, B = 0 had p = 0.0625 and a Tango interval excluding 0), and lies above −margin
    whenever the margin is shown: a REGRESSION never prints an interval reaching +, a PASS
    within the margin never prints one reaching beyond it."""
    rng = np.random.default_rng(4)
    design = Design.plan(1319, alpha=0.05, margin_pts=2.0)
    for _ in range(300):
        n = int(rng.choice([60, 300, 1319]))
        worse = int(rng.integers(0, n // 5))
        better = int(rng.integers(0, min(n // 5, n - worse) + 1))
        drop_low, drop_up = drop_bounds(worse, better, n, alpha=0.05)
        lo, hi = -float(drop_up), -float(drop_low)
        p = float(mcnemar_worse_p(worse, better))
        assert (hi < 0) == (p <= 0.05), (worse, better, n)
        if bool(design.rejects(0, worse, better, n)):
            assert hi < 0, (worse, better, n)
        if bool(design.within_margin(worse, better, n)):
            assert lo >= -0.02 - 1e-9, (worse, better, n)


def test_a_test_alone_is_judged_at_alpha_over_f_and_holm_keeps_its_flags():
    """Before the family is known a test is judged at alpha / F (Bonferroni); every flag it
    gives, Holm over the family gives too."""
    rng = np.random.default_rng(8)
    for _ in range(200):
        ps = rng.uniform(0, 0.01, 24) ** rng.uniform(0.5, 2)
        members = [
            FamilyMember(key=str(i), p_value=p, sequential_p=p, within_margin=False)
            for i, p in enumerate(ps)
        ]
        final = decide_family(members, alpha=0.05)
        for m, f in zip(members, final, strict=True):
            alone = decide_alone(m, alpha=0.05, family_size=24)
            assert f.flagged or not alone.flagged
            assert alone.adjusted_p >= f.adjusted_p - 1e-15


def test_worst_case_replay_scores_pd_errors_as_wrong():
    """The worst-case stream counts a PD error where the baseline was right as a PD-worse pair."""
    base = side([True] * 10)
    pd = [record(i, correct=False, ok=i >= 3) for i in range(10)]
    design = Design.plan(10, alpha=0.05, margin_pts=2.0)
    assert sequential_result([(base, pd)], design).n_pairs == 7
    worst = sequential_result([(base, pd)], design, pd_errors_wrong=True)
    assert (worst.n_pairs, worst.worse) == (10, 10)


def test_suspect_is_in_the_family():
    """SUSPECT hypotheses share the run's alpha with the accuracy ones: a Fisher p of 0.031 (14 vs
    5 corruption-grade divergences at identical accuracy, issue 30) is SUSPECT alone at 0.05, but
    not in a family of 24 tests, and not in `compare`'s family of two (accuracy and SUSPECT)."""
    members = [
        FamilyMember(
            key=f"c{i}", p_value=0.5, sequential_p=0.5, within_margin=False, suspect_p=0.031
        )
        for i in range(24)
    ]
    calls = decide_family(members, alpha=0.05)
    assert all(v.family_size == 48 and not v.suspect_flagged for v in calls)
    (pair,) = decide_family(members[:1], alpha=0.05)
    assert pair.family_size == 2 and not pair.suspect_flagged
    assert decide_alone(members[0], alpha=0.05, family_size=1).suspect_flagged


def test_suspect_and_accuracy_hypotheses_step_down_together():
    """Holm over both kinds: a tiny accuracy p rejected first leaves alpha / (F − 1) for SUSPECT."""
    members = [
        FamilyMember(key="a", p_value=1e-6, sequential_p=1e-6, within_margin=False, suspect_p=0.03)
    ]
    (call,) = decide_family(members, alpha=0.05)
    assert call.flagged and call.suspect_flagged and call.suspect_adjusted_p == 0.03


def _random_members(rng, count: int) -> list[FamilyMember]:
    return [
        FamilyMember(
            key=f"t{i}",
            p_value=1.0,
            sequential_p=float(p),
            within_margin=False,
            suspect_p=float(s) if rng.random() < 0.5 else None,
        )
        for i, (p, s) in enumerate(
            zip(rng.uniform(0, 0.01, count), rng.uniform(0, 0.02, count), strict=True)
        )
    ]


def test_a_shard_judges_with_the_whole_selections_family():
    """Holm over a shard's tests with the planned family size: a shard never flags what the
    merged run does not (default-gpu in 2 shards flagged at adjusted p 0.039 in a family of 12,
    0.077 in the run's 24), and with every test present it is Holm itself."""
    rng = np.random.default_rng(30)
    for _ in range(200):
        members = _random_members(rng, 24)
        planned = sum(1 + (m.suspect_p is not None) for m in members)
        merged = {v.key: v for v in decide_family(members, alpha=0.05)}
        assert decide_family(members, alpha=0.05, family_size=planned) == tuple(merged.values())
        for shard in (members[::2], members[1::2]):
            for v in decide_family(shard, alpha=0.05, family_size=planned):
                assert v.family_size == planned
                assert v.adjusted_p >= merged[v.key].adjusted_p
                assert v.flagged <= merged[v.key].flagged
                assert v.suspect_flagged <= merged[v.key].suspect_flagged
    shard = [
        FamilyMember(key=f"s{i}", p_value=1.0, sequential_p=p, within_margin=False)
        for i, p in enumerate([0.0032] + [0.5] * 11)
    ]
    assert decide_family(shard, alpha=0.05)[0].flagged  # the old call: a family of 12
    assert not decide_family(shard, alpha=0.05, family_size=24)[0].flagged


def test_the_power_rule_uses_the_pairs_the_test_had():
    """A test planned for 1319 pairs that got 300 (the rest failed on both sides) is judged
    underpowered at 300, not powered by the 1319 it planned (issue 30)."""
    base, pd = paired_sides(both=250, worse=5, better=5, neither=40)
    failed = [record(300 + i, correct=False, ok=False) for i in range(1019)]
    comparison = compare_paired([*base, *failed], [*pd, *failed])
    design = Design.plan(1319, alpha=0.05, margin_pts=2.0, family_size=24)
    policy = AnalysisPolicy(max_error_rate=1.0)
    runs = [([*base, *failed], [*pd, *failed])]
    seq = sequential_result(runs, design)
    member = FamilyMember(
        key="t", p_value=seq.p_value, sequential_p=seq.sequential_p, within_margin=seq.within_margin
    )
    decision = verdict_rules.TestDecision(
        design=design,
        member=member,
        family=decide_alone(member, alpha=0.05, family_size=24),
        worse=seq.worse,
        better=seq.better,
        n_pairs=seq.n_pairs,
    )
    v = decide(comparison, policy=policy, decision=decision)
    assert seq.n_pairs == 300
    assert v.verdict is Verdict.INCONCLUSIVE and "underpowered" in v.reason, v.reason
