"""Bisect mechanics on synthetic git histories, with a plain command as the predicate (no vLLM)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from pdcheck.bisect import BisectConfig, plan_bisect
from pdcheck.bisect.step import decide_outcome
from pdcheck.cli import cli
from pdcheck.errors import BisectError

# Exit 1 (bad) when the file says BUG, 2 (infra -> skip) when it says BROKEN, else 0 (good).
PREDICATE = (
    "import sys; t = open('vllm/thing.py').read(); "
    "sys.exit(1 if 'BUG' in t else 2 if 'BROKEN' in t else 0)"
)


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(
        ["git", "-C", str(repo), *args], check=True, capture_output=True, text=True
    ).stdout.strip()


def make_history(
    root: Path, n: int = 20, *, bug_at: int = 13, broken: tuple[int, ...] = ()
) -> tuple[Path, list[str]]:
    repo = root / "vllm-repo"
    (repo / "vllm").mkdir(parents=True)
    _git(repo, "init", "-q", "-b", "main")
    _git(repo, "config", "user.name", "t")
    _git(repo, "config", "user.email", "t@t")
    shas = []
    for i in range(n):
        state = "BUG" if i >= bug_at else "ok"
        if i in broken:
            state = "BROKEN"
        (repo / "vllm" / "thing.py").write_text(f"# commit {i}\nSTATE = '{state}'\n")
        _git(repo, "add", "-A")
        _git(
            repo,
            "commit",
            "-q",
            "-m",
            f"change {i}" + (" (introduces the bug)" if i == bug_at else ""),
        )
        shas.append(_git(repo, "rev-parse", "HEAD"))
    return repo, shas


def config(repo: Path, tmp: Path, good: str, bad: str, **kw) -> BisectConfig:
    base = dict(
        vllm_repo=str(repo),
        good=good,
        bad=bad,
        predicate="cmd",
        args=(sys.executable, "-c", PREDICATE),
        install="none",
        python=sys.executable,
        out_dir=str(tmp / "out"),
        cache_dir=str(tmp / "cache"),
    )
    return BisectConfig(**(base | kw))


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


def test_dry_run_plan(tmp_path):
    repo, shas = make_history(tmp_path)
    plan = plan_bisect(config(repo, tmp_path, shas[0], shas[-1]))
    assert plan.commits == 19 and plan.expected_steps == 5
    assert "pdcheck.bisect.step" in plan.render()


def test_bad_inputs_are_refused_and_touch_nothing(tmp_path):
    """Not a repo, unknown refs, good not an ancestor, a dirty tree: clear errors, exit 3."""
    repo, shas = make_history(tmp_path, n=4, bug_at=2)
    with pytest.raises(BisectError, match="not a git repository"):
        plan_bisect(config(tmp_path, tmp_path, "a", "b"))
    with pytest.raises(BisectError, match="--good 'nope' is not a commit"):
        plan_bisect(config(repo, tmp_path, "nope", shas[-1]))
    with pytest.raises(BisectError, match="not an ancestor"):
        plan_bisect(config(repo, tmp_path, shas[-1], shas[0]))
    (repo / "vllm" / "thing.py").write_text("dirty\n")
    with pytest.raises(BisectError, match="uncommitted changes"):
        plan_bisect(config(repo, tmp_path, shas[0], shas[-1]))
    assert (repo / "vllm" / "thing.py").read_text() == "dirty\n", "the user's change must survive"

    from pdcheck.cli import main

    code = main(
        [
            "bisect",
            "--vllm-repo",
            str(repo),
            "--good",
            shas[0],
            "--bad",
            shas[-1],
            "--cmd",
            "true",
            "--install",
            "none",
            "--out",
            str(tmp_path / "o"),
        ]
    )
    assert code == 3


def test_cli_requires_exactly_one_predicate(tmp_path):
    res = CliRunner().invoke(
        cli,
        ["bisect", "--vllm-repo", str(tmp_path), "--good", "a", "--bad", "b"],
        standalone_mode=False,
    )
    assert "choose exactly one predicate" in str(res.exception)
