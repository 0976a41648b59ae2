"""Greedy agreement: exact match, first divergence, and tie-aware grading at the baseline's top-2 margin."""

from __future__ import annotations

from pdcheck.analysis import compare_paired
from pdcheck.analysis.agreement import first_divergence, measure_agreement
from tests.unit.analysis.builders import record


def test_identical_token_ids_are_not_a_divergence():
    """Same token ids on both sides: no divergence, whatever the text says."""
    b = record(0, correct=True, token_ids=(5, 6, 7), completion="x")
    p = record(0, correct=True, token_ids=(5, 6, 7), completion="y")
    assert first_divergence(b, p, tie_epsilon_nats=0.05) is None


def test_first_divergence_position_and_tie_grade():
    """A flip where the baseline's top-2 margin is below epsilon is numeric jitter ('tie')."""
    b = record(0, correct=True, token_ids=(5, 6, 7, 8), margins=[2.0, 2.0, 0.01, 2.0])
    p = record(0, correct=True, token_ids=(5, 6, 9, 8))
    d = first_divergence(b, p, tie_epsilon_nats=0.05)
    assert (d.position, d.grade) == (2, "tie")
    assert abs(d.margin_nats - 0.01) < 1e-9


def test_clear_margin_is_corruption_grade():
    """A flip against a clear baseline margin (>= epsilon) is corruption-grade."""
    b = record(0, correct=True, token_ids=(5, 6, 7), margins=[3.0, 3.0, 3.0])
    p = record(0, correct=True, token_ids=(4, 6, 7))
    d = first_divergence(b, p, tie_epsilon_nats=0.05)
    assert (d.position, d.grade) == (0, "corruption")


def test_epsilon_is_configurable():
    """The same flip is a tie at a large epsilon and corruption at a small one."""
    b = record(0, correct=True, token_ids=(5, 6), margins=[0.3, 0.3])
    p = record(0, correct=True, token_ids=(5, 7))
    assert first_divergence(b, p, tie_epsilon_nats=0.5).grade == "tie"
    assert first_divergence(b, p, tie_epsilon_nats=0.1).grade == "corruption"


def test_unknown_margin_is_unclassified():
    """Without logprobs, or where the baseline stopped, the divergence is reported as unclassified."""
    b = record(0, correct=True, token_ids=(5, 6))
    p = record(0, correct=True, token_ids=(5, 7))
    assert first_divergence(b, p, tie_epsilon_nats=0.05).grade == "unclassified"
    shorter = record(0, correct=True, token_ids=(5,), margins=[3.0])
    longer = record(0, correct=True, token_ids=(5, 6))
    d = first_divergence(shorter, longer, tie_epsilon_nats=0.05)
    assert (d.position, d.grade) == (1, "unclassified")


def test_text_fallback_uses_character_positions():
    """Without token ids the completions are compared as text, and positions are characters."""
    b = record(0, correct=True, token_ids=None, completion="The answer is 42")
    p = record(0, correct=True, token_ids=None, completion="The answer is 43")
    d = first_divergence(b, p, tie_epsilon_nats=0.05)
    assert d.position == 15
    a = measure_agreement([(b, p)], tie_epsilon_nats=0.05)
    assert a.position_unit == "chars"


def test_measure_agreement_counts_and_histogram():
    """Exact-match fraction, grade counts and the position histogram add up over the pairs."""
    pairs = []
    for i in range(10):
        b = record(i, correct=True, token_ids=(1, 2, 3, 4, 5), margins=[1.0, 1.0, 0.01, 1.0, 1.0])
        toks = {0: (9, 2, 3, 4, 5), 1: (1, 2, 9, 4, 5), 2: (1, 2, 3, 4, 9)}.get(i, (1, 2, 3, 4, 5))
        pairs.append((b, record(i, correct=True, token_ids=toks)))
    a = measure_agreement(pairs, tie_epsilon_nats=0.05)
    assert a.exact_match_fraction == 0.7
    assert (a.n_tie, a.n_corruption, a.n_unclassified) == (1, 2, 0)
    assert sum(a.position_histogram.values()) == 3
    assert (
        a.position_histogram["0-0"] == 1
        and a.position_histogram["1-3"] == 1
        and a.position_histogram["4-15"] == 1
    )


def test_control_test_flags_excess_corruption_only():
    """PD with many corruption-grade flips against a clean baseline repeat gives a small Fisher p;
    tie flips alone do not."""
    base = [
        record(i, correct=True, token_ids=(1, 2, 3), margins=[2.0, 0.01, 2.0]) for i in range(200)
    ]
    corrupt = [
        record(i, correct=True, token_ids=(9, 2, 3) if i % 10 == 0 else (1, 2, 3))
        for i in range(200)
    ]
    ties = [
        record(i, correct=True, token_ids=(1, 9, 3) if i % 10 == 0 else (1, 2, 3))
        for i in range(200)
    ]
    c = compare_paired(base, corrupt, baseline_repeats=[base])
    assert c.control.basis == "corruption-grade"
    assert c.control.pd_count == 20 and c.control.control_count == 0
    assert c.control.p_value < 1e-4
    assert compare_paired(base, ties, baseline_repeats=[base]).control.p_value == 1.0


def test_without_logprobs_the_control_test_counts_all_divergences():
    """With no margins anywhere, PD and control are compared on any divergence, the same basis for both."""
    base = [record(i, correct=True) for i in range(100)]
    pd = [record(i, correct=True, token_ids=(1, 9, 3) if i < 15 else (1, 2, 3)) for i in range(100)]
    c = compare_paired(base, pd, control=base)
    assert c.control.basis == "any-divergence"
    assert c.control.source == "control"
    assert c.control.pd_count == 15
