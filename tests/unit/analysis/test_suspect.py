"""SUSPECT is calibrated by the control's measured jitter alone (issue 17 point 5, issue 29 item 7).

Near-tie flips are numeric jitter: the tie threshold is the jitter measured where the control
and the baseline still agree, so flips the baseline's own repeats make are not counted. PD's
jitter is never used: a corrupting PD moves its own margins by nats before it flips a token,
and a threshold measured from PD climbed with the corruption until it hid it (issue 29: 5
corrupted answers in 200 stayed PASS while the threshold went from 1.1 to 11 nats).
"""

from __future__ import annotations

import numpy as np

from pdcheck.analysis import Verdict, compare_paired, decide
from pdcheck.config import AnalysisPolicy
from pdcheck.evals.records import QuestionRecord, TokenLogprobs

N, TOKENS = 1319, 16


def _run(rng, margins: np.ndarray, jitter: float, corrupt: float = 0.0) -> list[QuestionRecord]:
    """One greedy run over fixed per-position margins: a position flips when its noisy margin
    goes below 0 (or, for `corrupt` of the questions, at a random confident position)."""
    records = []
    for q, row in enumerate(margins):
        noisy = row + rng.normal(0.0, jitter, row.size)
        flip_at = int(np.argmax(noisy < 0)) if (noisy < 0).any() else None
        if rng.random() < corrupt:
            flip_at = int(rng.integers(0, TOKENS))
        end = len(noisy) if flip_at is None else flip_at + 1
        records.append(_record(q, flip_at, [abs(m) for m in noisy[:end]], correct=q % 4 != 0))
    return records


def _record(q: int, flip_at: int | None, margins: list[float], *, correct: bool) -> QuestionRecord:
    """A greedy completion whose token at `flip_at` differs from the baseline's, with these top-2
    margins (nats) at its positions."""
    tokens = [1000 + t if t == flip_at else t for t in range(len(margins))]
    logprobs = tuple(
        TokenLogprobs(str(tok), -0.01, (("x", -0.01), ("y", -0.01 - m)))
        for tok, m in zip(tokens, margins, strict=True)
    )
    return QuestionRecord(
        index=q,
        prompt_sha256="p",
        gold="1",
        ok=True,
        completion="c",
        token_ids=tuple(tokens),
        logprobs=logprobs,
        correct=correct,
    )


def _margins(rng) -> np.ndarray:
    # Mostly confident positions, some near-ties: 5% of positions within 0.15 nats.
    return np.where(rng.random((N, TOKENS)) < 0.05, rng.uniform(0, 0.15, (N, TOKENS)), 5.0)


def _baseline(margins: np.ndarray) -> list[QuestionRecord]:
    return _run(np.random.default_rng(0), margins, 0.0)


def test_pd_as_noisy_as_the_control_is_not_suspect_with_measured_jitter():
    """Two clean cells, PD and control both jittering 0.02 nats against the baseline: SUSPECT in
    neither, and the threshold is the control's jitter (above the 0.05 floor)."""
    suspect_measured = 0
    for seed in range(2):
        rng = np.random.default_rng(seed)
        margins = _margins(rng)
        base = _baseline(margins)
        pd, control = _run(rng, margins, 0.02), _run(rng, margins, 0.02)
        c = compare_paired(base, pd, control=control)
        suspect_measured += decide(c, policy=AnalysisPolicy()).verdict is Verdict.SUSPECT
        assert c.control is not None and c.control.tie_epsilon_nats == c.control.control_jitter_nats
    assert suspect_measured == 0


QUESTIONS, CORRUPTED, POSITIONS = 200, 5, 12


def _greedy_run(*, corrupted: frozenset[int] = frozenset()) -> list[QuestionRecord]:
    """A deterministic greedy run (CPU: repeats agree bit for bit) of QUESTIONS questions.

    A corrupted question keeps its answer (correct as in the baseline) but its KV damage moves
    every margin before the flip by 2-12 nats, then flips a token the baseline was 3 nats sure of.
    """
    records = []
    for q in range(QUESTIONS):
        flip = 8 if q in corrupted else None
        margins = [
            3.0 + (2.0 + (q * 7 + t) % 11 if flip is not None and t < flip else 0.0)
            for t in range(POSITIONS)
        ]
        records.append(_record(q, flip, margins, correct=q % 3 != 0))
    return records


def test_five_corrupted_but_correct_answers_in_200_are_suspect_with_two_repeats():
    """Issue 29's bar: 5 of 200 answers corrupted but still correct, 2 repeats (the baseline's
    second run is the control): SUSPECT, with the threshold at the policy's floor because the
    baseline's repeats agree; PD's corrupted margins do not raise it."""
    corrupted = frozenset(range(0, QUESTIONS, QUESTIONS // CORRUPTED))
    baseline = [_greedy_run(), _greedy_run()]
    pd = [_greedy_run(corrupted=corrupted), _greedy_run(corrupted=corrupted)]
    c = compare_paired(baseline[0], pd[0], baseline_repeats=[baseline[1]], pd_repeats=[pd[1]])
    assert c.delta_pts == 0.0
    assert c.control is not None and c.control.tie_epsilon_nats == 0.05
    assert (c.control.pd_count, c.control.pd_pairs) == (2 * CORRUPTED, 2 * QUESTIONS)
    v = decide(c, policy=AnalysisPolicy())
    assert v.verdict is Verdict.SUSPECT, v.reason
    assert v.family_size == 2  # accuracy and SUSPECT: one family


def test_suspect_off_says_why():
    """Logprobs recorded and no divergence at all: SUSPECT was judged (nothing to flag), so no
    "SUSPECT off" line; without logprobs the line says none were recorded."""
    run = _greedy_run()
    judged = decide(compare_paired(run, run, baseline_repeats=[run]), policy=AnalysisPolicy())
    assert not judged.verdict.flagged and "SUSPECT off" not in judged.reason
    plain = [
        QuestionRecord(
            index=r.index, prompt_sha256="p", gold="1", ok=True, completion="c", correct=r.correct
        )
        for r in run
    ]
    off = decide(compare_paired(plain, plain, baseline_repeats=[plain]), policy=AnalysisPolicy())
    assert "SUSPECT off: no logprobs were recorded" in off.reason


def test_confident_flips_are_still_suspect():
    """2% of questions flipped at confident positions (a race hitting one slot) is SUSPECT."""
    rng = np.random.default_rng(7)
    margins = _margins(rng)
    base = _baseline(margins)
    pd, control = _run(rng, margins, 0.02, corrupt=0.02), _run(rng, margins, 0.02)
    v = decide(compare_paired(base, pd, control=control), policy=AnalysisPolicy())
    assert v.verdict is Verdict.SUSPECT, v.reason


def test_without_a_control_suspect_says_it_is_off():
    """No control run: the verdict says plainly that SUSPECT was not tested."""
    rng = np.random.default_rng(1)
    margins = _margins(rng)
    v = decide(
        compare_paired(_baseline(margins), _run(rng, margins, 0.03)), policy=AnalysisPolicy()
    )
    assert "SUSPECT off: no control run" in v.reason
