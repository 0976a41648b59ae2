"""The issue-30 bar at full size: 3,000 simulated clean sweeps per setting and d, merged and in
1-4 shards, P(any REGRESSION or SUSPECT) ≤ alpha + 3 Monte Carlo s.e. (about a minute and a
half; its unit twin, tests/unit/analysis/test_sweep_promise.py, says how; `-s` prints the rates
docs/analysis.md quotes)."""

from __future__ import annotations

import pytest

from tests.unit.analysis.test_sweep_promise import SETTINGS, check_clean_sweeps


@pytest.mark.parametrize(("repeats", "early_stop", "suspect"), SETTINGS)
def test_a_clean_sweep_fails_at_most_alpha_3000_sweeps(repeats, early_stop, suspect):
    """≤ alpha + 3 s.e. for every d, merged and for every shard count."""
    check_clean_sweeps(repeats=repeats, early_stop=early_stop, suspect=suspect, sims=3000, seed=300)
