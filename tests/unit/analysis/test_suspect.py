"""SUSPECT is calibrated by measured jitter (point 5 of issue 17).

A PD whose numerics are a little noisier than its control's (0.03 vs 0.02 nats of margin
jitter) flips more near-ties. With a fixed 0.05-nat tie threshold those flips count as
corruption-grade and most clean cells come out SUSPECT; with the threshold set by the jitter
measured where the runs still agree, they do not. A real corruption (confident flips) still is.
"""

from __future__ import annotations

import numpy as np

from pdcheck.analysis import Verdict, compare_paired, decide
from pdcheck.analysis.agreement import measure_agreement
from pdcheck.analysis.stats import fisher_greater_p
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
        tokens, logprobs = [], []
        for t, m in enumerate(noisy):
            flipped = t == flip_at
            tokens.append(1000 + t if flipped else t)
            logprobs.append(
                TokenLogprobs(str(tokens[-1]), -0.01, (("x", -0.01), ("y", -0.01 - abs(m))))
            )
            if flipped:
                break
        records.append(
            QuestionRecord(
                index=q,
                prompt_sha256="p",
                gold="1",
                ok=True,
                completion="c",
                token_ids=tuple(tokens),
                logprobs=tuple(logprobs),
                correct=q % 4 != 0,
            )
        )
    return records


def _margins(rng) -> np.ndarray:
    # Mostly confident positions, some near-ties: 5% of positions within 0.15 nats.
    return np.where(rng.random((N, TOKENS)) < 0.05, rng.uniform(0, 0.15, (N, TOKENS)), 5.0)


def _baseline(margins: np.ndarray) -> list[QuestionRecord]:
    return _run(np.random.default_rng(0), margins, 0.0)


def test_noisier_pd_numerics_are_not_suspect_with_measured_jitter():
    """Three clean cells, PD jitter 0.03 vs control 0.02 nats: SUSPECT in none, where the fixed
    0.05-nat threshold (the old rule: Fisher on counts graded at 0.05) flags most."""
    suspect_fixed = suspect_measured = 0
    for seed in range(3):
        rng = np.random.default_rng(seed)
        margins = _margins(rng)
        base = _baseline(margins)
        pd, control = _run(rng, margins, 0.03), _run(rng, margins, 0.02)
        c = compare_paired(base, pd, control=control)
        suspect_measured += decide(c, policy=AnalysisPolicy()).verdict is Verdict.SUSPECT
        old_pd = measure_agreement(list(zip(base, pd, strict=True)), tie_epsilon_nats=0.05)
        old_ctrl = measure_agreement(list(zip(base, control, strict=True)), tie_epsilon_nats=0.05)
        old_p = fisher_greater_p(old_pd.n_corruption, N, old_ctrl.n_corruption, N)
        suspect_fixed += old_p < 0.05
    assert suspect_fixed >= 2
    assert suspect_measured == 0


def test_confident_flips_are_still_suspect():
    """2% of questions flipped at confident positions (a race hitting one slot) is SUSPECT."""
    rng = np.random.default_rng(7)
    margins = _margins(rng)
    base = _baseline(margins)
    pd, control = _run(rng, margins, 0.03, corrupt=0.02), _run(rng, margins, 0.02)
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
