"""Every PASS is bounded (issue 42): at a true drop equal to the margin, a clean level of each
shipped sweep PASSes with probability at most alpha; the powered-but-unbounded route is
NO-DROP-SHOWN, never PASS, and its interval cannot read as a pass.

PASS has one route, "the drop is shown within the margin" (at an interim look or the last),
so P(PASS) ≤ P(some look shows the margin), which `power.operating` computes exactly for the
level's design (looks, shares, the margin bound) at i.i.d. pairs. `tests/slow/test_pass_bound_sim.py`
simulates the same designs through `decide` itself.
"""

from __future__ import annotations

import re

import pytest

from pdcheck.analysis import verdict as verdict_rules
from pdcheck.analysis.design import Design
from pdcheck.analysis.family import FamilyMember, decide_alone
from pdcheck.analysis.paired import compare_paired
from pdcheck.analysis.power import drop_probabilities, operating
from pdcheck.analysis.verdict import LevelEvidence, Status, Verdict, decide, judge
from pdcheck.config import AnalysisPolicy, expand_cells, load_sweep
from pdcheck.config.load import shipped_sweep_names
from pdcheck.sweep.judging import clean_level_designs, clean_tests
from tests.unit.analysis.builders import paired_sides


def _designs(name: str) -> list[tuple[Design, float]]:
    cells = expand_cells(load_sweep(name))
    found = {
        (design, cell.analysis.alpha)
        for cell, _c, design in clean_level_designs(cells, family_size=clean_tests(cells))
    }
    return sorted(found, key=lambda x: x[0].planned_pairs)


@pytest.mark.parametrize("name", shipped_sweep_names())
def test_at_a_drop_equal_to_the_margin_a_level_passes_at_most_alpha_of_the_time(name):
    """Exact, for every clean design of the sweep, with the drop's discordant pairs all PD-worse
    (d = the margin) and at 15% discordance."""
    for design, alpha in _designs(name):
        drop = design.margin_pts / 100
        for d in (drop, 0.15):
            p_worse, p_better = drop_probabilities(d, drop)
            o = operating(design, p_worse=p_worse, p_better=p_better)
            p_pass = o.within + o.within_end
            assert p_pass <= alpha, (name, design.planned_pairs, d, p_pass)


def _default_gpu_level(worse: int, better: int, n: int = 1319) -> tuple[LevelEvidence, Design]:
    """One default-gpu clean level (24 hypotheses, one look, margin 2) with these counts."""
    base, pd = paired_sides(both=n - worse - better - 100, worse=worse, better=better, neither=100)
    design = Design.plan(n, alpha=0.05, margin_pts=2.0, family_size=24)
    last = design.outcome(0, worse, better, n)
    member = FamilyMember(
        key="default-gpu@c8",
        p_value=last.p_value,
        sequential_p=design.sequential_p((last,)),
        within_margin=last.within_margin,
    )
    decision = verdict_rules.TestDecision(
        design=design,
        member=member,
        family=decide_alone(member, alpha=0.05, family_size=24),
        worse=worse,
        better=better,
        n_pairs=n,
    )
    return LevelEvidence(comparison=compare_paired(base, pd), decision=decision), design


def test_the_issue_42_input_is_not_a_pass():
    """W = 30, B = 12, n = 1319 in default-gpu: p = 0.004 > 0.05/24, the margin not shown, power
    1. It was PASS beside a "90% CI" of [-2.98, -0.34]; now it is NO-DROP-SHOWN, its interval
    says its proven level, and at the test's own level Δ's upper end is ≥ 0 (no drop shown)."""
    evidence, _ = _default_gpu_level(30, 12)
    v = decide(evidence, policy=AnalysisPolicy())
    assert v.verdict is Verdict.NO_DROP_SHOWN, v.reason
    assert not v.reason.startswith("PASS") and "not shown within the 2.00-pt margin" in v.reason
    assert "≥89% CI [-2.98, -0.34]" in v.reason, v.reason
    at_test = re.search(r"at the test's level \(([\d.e-]+)\) Δ ≤ ([+-][\d.]+)", v.reason)
    assert at_test is not None, v.reason
    assert float(at_test.group(1)) == pytest.approx(0.05 / 24, rel=0.01)
    assert float(at_test.group(2)) >= 0
    allowed = judge(v.verdict, v.reason, canary=False)
    assert allowed.status is Status.INCONCLUSIVE
    forbidden = judge(v.verdict, v.reason, canary=False, allow_no_drop_shown=False)
    assert forbidden.status is Status.FAIL and "allow_no_drop_shown" in forbidden.reason
    assert judge(v.verdict, v.reason, canary=True).status is Status.FAIL


def test_a_pass_is_always_within_the_margin():
    """A level whose drop is shown within the margin PASSes and says so, with its bound."""
    evidence, _ = _default_gpu_level(20, 18)
    v = decide(evidence, policy=AnalysisPolicy())
    assert v.verdict is Verdict.PASS and v.reason.startswith("within the margin"), v.reason
    assert v.ci_low_pts is not None and v.ci_low_pts >= -2.0
