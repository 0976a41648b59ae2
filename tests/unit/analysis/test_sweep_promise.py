"""The run-level promise, by seeded simulation through the run's decision code: a clean sweep
(no drop and no corruption anywhere) gives any REGRESSION or SUSPECT with probability ≤ alpha,
and so does "some shard of it fails", with SUSPECT in the family and shards judged alone.

Settings of the issue-30 bar: `default-gpu`'s 24 clean tests (8 cells × 3 levels), n = 1319
per repeat, alpha 0.05, margin 2; d from 2% to 40%; 1 and 3 repeats, early stop on and off;
SUSPECT on with 2 (and 3) repeats, the baseline's repeats as control; 1 to 4 shards, a cell's
levels in one shard. Each test's pairs run through its `Design`'s looks (the vectorised form
`test_simulation.py` checks against the live `SequentialTest`); corruption-grade divergences
are i.i.d. at rate d/2 per pair on PD and on the control pairs alike (the clean model), and
their one-sided Fisher p is the one `paired.py` computes. The run's call is `decide_family`
over every test's hypotheses in the planned family, merged and per shard.

This file runs a cheap seeded version (200 sweeps per setting, assert ≤ alpha + 3 s.e.);
`tests/slow/test_sweep_promise_heavy.py` runs 3,000 per setting (`-s` prints the rates).
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import numpy as np
import pytest
from scipy import stats

from pdcheck.analysis.design import Design
from pdcheck.analysis.family import FamilyMember, decide_family
from tests.unit.analysis.test_simulation import ALPHA, MARGIN_PTS, N, simulate

CELLS, LEVELS = 8, 3
TESTS = CELLS * LEVELS
DISCORDANCES = (0.02, 0.05, 0.15, 0.40)
SETTINGS = [  # (repeats, early stop, SUSPECT judged)
    (1, False, False),
    (1, True, False),
    (3, False, False),
    (3, True, False),
    (2, False, True),
    (2, True, True),
    (3, True, True),
]


@dataclass(frozen=True)
class Rates:
    """Share of simulated clean sweeps with any flag (merged), and with a failing shard, by shards."""

    any_flag: float
    shard_fails: dict[int, float]


def _suspect_p(rng, *, repeats: int, rate: float, sims: int) -> np.ndarray:
    """One-sided Fisher p of PD's corruption-grade count (every repeat) against the baseline
    repeats' (repeats − 1 control pairs per question), under the same rate: clean."""
    pd_pairs, control_pairs = N * repeats, N * (repeats - 1)
    k_pd = rng.binomial(pd_pairs, rate, (sims, TESTS))
    k_control = rng.binomial(control_pairs, rate, (sims, TESTS))
    total = pd_pairs + control_pairs
    return np.asarray(stats.hypergeom.sf(k_pd - 1, total, k_pd + k_control, pd_pairs))


def simulate_clean_sweeps(
    rng, *, d: float, repeats: int, early_stop: bool, suspect: bool, sims: int
) -> Rates:
    planned = TESTS * (1 + suspect)
    design = Design.plan(
        N * repeats,
        alpha=ALPHA,
        margin_pts=MARGIN_PTS,
        family_size=planned,
        early_stop=early_stop,
    )
    seq_p, within, _ = simulate(rng, design, [d / 2] * TESTS, [d / 2] * TESTS, sims)
    suspect_p = _suspect_p(rng, repeats=repeats, rate=d / 2, sims=sims) if suspect else None
    smallest = seq_p.min(axis=1)
    if suspect_p is not None:
        smallest = np.minimum(smallest, suspect_p.min(axis=1))
    any_flag = 0
    shard_fails = dict.fromkeys(range(1, 5), 0)
    # Holm's first threshold is alpha / planned, in a shard too: below it nothing can flag.
    for s in np.flatnonzero(smallest <= ALPHA / planned):
        members = [
            FamilyMember(
                key=str(t),
                p_value=1.0,
                sequential_p=float(seq_p[s, t]),
                within_margin=bool(within[s, t]),
                suspect_p=None if suspect_p is None else float(suspect_p[s, t]),
            )
            for t in range(TESTS)
        ]
        any_flag += _fails(members, planned)
        for shards in shard_fails:
            shard_fails[shards] += any(
                _fails([m for t, m in enumerate(members) if (t // LEVELS) % shards == i], planned)
                for i in range(shards)
            )
    return Rates(any_flag / sims, {k: v / sims for k, v in shard_fails.items()})


def _fails(members: list[FamilyMember], planned: int) -> bool:
    calls = decide_family(members, alpha=ALPHA, family_size=planned)
    return any(c.flagged or c.suspect_flagged for c in calls)


def check_clean_sweeps(*, repeats: int, early_stop: bool, suspect: bool, sims: int, seed: int):
    """At every d: P(any flag) ≤ alpha + 3 Monte Carlo s.e., and no shard count fails more."""
    rng = np.random.default_rng(seed + 10 * repeats + 2 * early_stop + suspect)
    bound = ALPHA + 3 * (ALPHA * (1 - ALPHA) / sims) ** 0.5
    for d in DISCORDANCES:
        r = simulate_clean_sweeps(
            rng, d=d, repeats=repeats, early_stop=early_stop, suspect=suspect, sims=sims
        )
        setting = {"d": d, "repeats": repeats, "early_stop": early_stop, "suspect": suspect}
        print(json.dumps({**setting, **vars(r)}))
        assert r.any_flag <= bound, (d, r)
        assert max(r.shard_fails.values()) <= r.any_flag, (d, r)


@pytest.mark.parametrize(("repeats", "early_stop", "suspect"), SETTINGS)
def test_a_clean_sweep_fails_at_most_alpha_merged_and_sharded(repeats, early_stop, suspect):
    """P(any REGRESSION or SUSPECT) ≤ alpha and P(some shard fails) ≤ alpha, for 1-4 shards
    and d from 2% to 40% (200 seeded sweeps each: ≤ alpha + 3 Monte Carlo s.e.)."""
    check_clean_sweeps(repeats=repeats, early_stop=early_stop, suspect=suspect, sims=200, seed=30)
