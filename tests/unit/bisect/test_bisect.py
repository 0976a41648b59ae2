"""Bisect mechanics that need no git history: the run policies and the CLI's options.

The checks on synthetic git histories (the plan, refused inputs, whole bisects) start git and
predicate processes: tests/slow/test_bisect_runs.py.
"""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from pdcheck.bisect.step import decide_outcome
from pdcheck.cli import cli


@pytest.mark.parametrize(
    ("codes", "policy", "outcome"),
    [
        ([0, 0, 0], "any-bad", "good"),
        ([0, 1, 0], "any-bad", "bad"),
        ([0, 2, 0], "any-bad", "skip"),
        ([1, 1, 0], "majority", "bad"),
        ([0, 0, 1], "majority", "good"),
        ([0, 1, 2], "majority", "skip"),
    ],
)
def test_policies(codes, policy, outcome):
    """Repeated noisy runs are combined by the stated policy; infra never becomes bad."""
    assert decide_outcome(codes, policy)[0] == outcome


def test_cli_requires_exactly_one_predicate(tmp_path):
    res = CliRunner().invoke(
        cli,
        ["bisect", "--vllm-repo", str(tmp_path), "--good", "a", "--bad", "b"],
        standalone_mode=False,
    )
    assert "choose exactly one predicate" in str(res.exception)
