"""Bit-exact judging's evidence: greedy identity per repeat, and the first token where PD parts."""

from __future__ import annotations

from dataclasses import replace

from pdcheck.analysis.exact import check_exact, exact_regression_reason
from pdcheck.evals.records import TokenLogprobs
from tests.unit.analysis.builders import json_round_trip, record


def _runs(divergent: dict[int, int], *, n: int = 10, repeats: int = 1):
    """(baseline, PD) repeats of `n` questions; PD's token at `divergent[q]` differs for each q."""
    runs = []
    for _ in range(repeats):
        base = [record(i, correct=True, margins=[0.5, 0.01, 3.0, 2.0]) for i in range(n)]
        pd = []
        for b in base:
            p = record(b.index, correct=True, margins=[0.5, 0.01, 3.0, 2.0])
            if b.index in divergent:
                at = divergent[b.index]
                ids = list(p.token_ids or ())
                ids[at] = 99
                logprobs = list(p.logprobs or ())
                logprobs[at] = TokenLogprobs("PD!", -0.2, logprobs[at].top)
                p = replace(p, token_ids=tuple(ids), logprobs=tuple(logprobs))
            pd.append(p)
        runs.append((base, pd))
    return runs


def test_identical_runs_are_exact_and_give_no_reason():
    """Every PD repeat token for token equal to its baseline: no divergence, nothing to flag."""
    check = check_exact(_runs({}, repeats=2), exact=True, reason="r", tie_epsilon_nats=0.05)
    assert (check.n_pairs, check.n_identical, check.n_divergent) == (20, 20, 0)
    assert exact_regression_reason(check) is None


def test_one_divergence_where_exact_is_a_regression_with_its_question_and_token():
    """One question parts from the baseline at token 2 in an exact cell: a reason naming the
    question, the repeat, the position, both tokens and the baseline's margin there; no margin
    or alpha is involved."""
    check = check_exact(_runs({7: 2}), exact=True, reason="r", tie_epsilon_nats=0.05)
    assert check.n_divergent == 1
    (d,) = check.divergences
    assert (d.index, d.repeat, d.position, d.baseline_token, d.pd_token) == (7, 0, 2, "t2", "PD!")
    assert d.grade == "corruption" and abs(d.margin_nats - 3.0) < 1e-9
    reason = exact_regression_reason(check)
    assert reason is not None
    assert reason.startswith("bit-exact: 1 of 10 greedy outputs differ")
    assert "q00007 r0 at token 2" in reason and "'t2'" in reason and "'PD!'" in reason


def test_a_near_tie_flip_counts_where_exact():
    """Exactness leaves no jitter to excuse a flip: a divergence at a 0.01-nat near-tie is a
    regression too, and is shown graded as a tie with its margin."""
    check = check_exact(_runs({3: 1}), exact=True, reason="r", tie_epsilon_nats=0.05)
    assert check.divergences[0].grade == "tie"
    assert exact_regression_reason(check) is not None


def test_where_not_exact_divergences_are_listed_but_never_a_reason():
    """A cell that is not exact (decided before the run) keeps its divergences as evidence,
    with their margins, and never turns them into a regression."""
    check = check_exact(_runs({1: 1, 4: 1}), exact=False, reason="bf16", tie_epsilon_nats=0.05)
    assert check.n_divergent == 2 and [d.index for d in check.divergences] == [1, 4]
    assert all(d.margin_nats is not None and d.margin_nats < 0.05 for d in check.divergences)
    assert exact_regression_reason(check) is None


def test_repeats_pair_with_their_own_baseline_and_failed_requests_are_left_out():
    """PD repeat k is compared with baseline repeat k; a question either side failed is no pair."""
    runs = _runs({2: 0}, repeats=2)
    runs[1][1][5] = record(5, correct=False, ok=False)
    check = check_exact(runs, exact=True, reason="r", tie_epsilon_nats=0.05)
    assert check.n_pairs == 19
    assert [(d.repeat, d.index) for d in check.divergences] == [(0, 2), (1, 2)]


def test_the_check_survives_the_store():
    """The check is written into verdicts/c<N>.json and read back equal (the report reads it)."""
    check = check_exact(_runs({7: 2}), exact=True, reason="r", tie_epsilon_nats=0.05)
    assert json_round_trip(check) == check
