"""Bisect mechanics that need no git history: the run policies and the CLI's options.

The checks on synthetic git histories (the plan, refused inputs, whole bisects) start git and
predicate processes: tests/slow/test_bisect_runs.py.
"""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from pdcheck.bisect.runner import BisectResult, estimate_steps
from pdcheck.bisect.step import decide_outcome, explain_infra, git_exit
from pdcheck.cli import cli, main
from pdcheck.cli.race import race_argv


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


# --- issue 39 item 6: git bisect on real checkouts ---------------------------------------


def test_step_estimate_counts_endpoints_and_known_skips():
    """The plan's estimate is honest: both endpoints, log2 of the range, one per cached skip."""
    assert estimate_steps(34, endpoints=False) == 6
    assert estimate_steps(34) == 8
    assert estimate_steps(34, known_skips=21) == 29
    assert estimate_steps(3, known_skips=10, endpoints=False) == 2 + 2


@pytest.mark.parametrize(
    ("outcome", "find", "code"),
    [("good", "regression", 0), ("bad", "regression", 1), ("bad", "fix", 0), ("good", "fix", 1)],
)
def test_find_maps_the_predicate_to_gits_old_and_new(outcome, find, code):
    """Looking for a fix, a failing predicate is git's old term and a passing one the new."""
    assert git_exit(outcome, find) == code
    assert git_exit("skip", find) == 125


def test_an_import_break_is_named_as_an_import_error_not_as_missing_internals():
    """The 34-commit history's skips said 'VllmIncompatible ... missing: Scheduler.schedule';
    the modules named are imported again and the ImportError is the reason (and is cached)."""
    log = (
        "VllmIncompatible: vLLM 0.32.0 is not compatible with pdcheck's adapter; missing: "
        "vllm.v1.core.sched.scheduler:Scheduler.schedule. Update pdcheck/_vllm for this version\n"
    )
    why = explain_infra(log, lambda mods: {mods[0]: "ImportError: cannot import name 'Foo'"})
    assert why == (
        "the commit does not import: vllm.v1.core.sched.scheduler: ImportError: cannot import "
        "name 'Foo'"
    )
    assert "cannot drive" in str(explain_infra(log, lambda mods: {}))
    assert explain_infra("server crashed\n", lambda mods: {}) is None, "a crash may pass on retry"


def _result(steps, candidates, find="regression"):
    return BisectResult(
        first_bad=None,
        candidates=tuple(candidates),
        steps=steps,
        policy="any-bad",
        find=find,
        new_endpoint="b" * 40,
    )


def test_with_no_bad_commit_found_the_report_says_so():
    """Every tested commit good, the rest skipped: no 'one of N' as if a culprit were narrowed."""
    steps = [{"sha": "a" * 40, "outcome": "good", "reason": "", "cached": False}]
    steps += [{"sha": "b" * 40, "outcome": "bad", "reason": "", "cached": False}]
    steps += [
        {"sha": f"{i}" * 40, "outcome": "skip", "reason": "x", "cached": False} for i in (1, 2)
    ]
    md = _result(steps, ["1" * 40, "2" * 40, "b" * 40]).render_markdown()
    assert "No bad commit was found before the new endpoint bbbbbbbbbbbb" in md
    assert "2 could not be tested" in md and "first bad commit is one of" not in md
    steps.append({"sha": "3" * 40, "outcome": "bad", "reason": "", "cached": False})
    assert "first bad commit is one of" in _result(steps, ["1" * 40, "3" * 40]).render_markdown()


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["--releases", "0.30.0..0.22.0", "--race"], "FIRST must be older than LAST"),
        (["--releases", "0.22.0..0.30.0", "--race", "--vllm-repo", "."], "--vllm-repo cannot go"),
        (["--releases", "0.22.0..0.30.0", "--race", "--good", "x"], "--good cannot go"),
        (["--releases", "0.22.0..0.30.0", "--cmd", "true"], "--cmd cannot go"),
        (["--releases", "0.22.0..0.30.0"], "--releases needs --race"),
        (["--race", "--good", "a", "--bad", "b"], "missing --vllm-repo"),
    ],
)
def test_release_bisect_bad_input_exits_3_and_starts_nothing(argv, says, capsys):
    """Wrong input is refused before pip or any harness runs (the unit tier forbids both)."""
    assert main(["bisect", *argv]) == 3
    assert says in capsys.readouterr().err


def test_race_options_are_passed_to_the_release_child_unchanged():
    """The child on a release runs exactly the options the user gave."""
    argv = race_argv(
        seeds=2,
        seed_start=5,
        requests=40,
        variants=("attention",),
        disable=("zeroing",),
        depth=None,
        mutation=None,
        trace_dir=None,
    )
    assert argv == [
        "--seeds", "2", "--seed-start", "5", "--requests", "40",
        "--variant", "attention", "--disable-fix", "zeroing",
    ]  # fmt: skip
