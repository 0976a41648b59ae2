"""Whole bisects on synthetic git histories: `git bisect run` drives one predicate process per step.

Also the plan and the refused inputs, which read a synthetic history with git (moved from
tests/unit/bisect, which keeps the checks that start no process: the policies, the CLI's options).
"""

from __future__ import annotations

import json
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from pdcheck.bisect import BisectConfig, plan_bisect, run_bisect
from pdcheck.cli import cli, main
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


def test_dry_run_plan(tmp_path):
    repo, shas = make_history(tmp_path)
    plan = plan_bisect(config(repo, tmp_path, shas[0], shas[-1]))
    assert plan.commits == 19 and plan.expected_steps == 5 + 2, (
        "log2 of the range plus both endpoints"
    )
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


def test_names_exactly_the_first_bad_commit(tmp_path):
    """With a deterministic predicate, bisect names the commit that introduced the failure."""
    repo, shas = make_history(tmp_path)
    result = run_bisect(config(repo, tmp_path, shas[0], shas[-1]))
    assert result.first_bad is not None and result.first_bad.sha == shas[13]
    assert result.first_bad.subject == "change 13 (introduces the bug)"
    out = tmp_path / "out"
    assert f"# first bad commit: [{shas[13]}]" in (out / "bisect.log").read_text()
    assert "change 13" in (out / "bisect.md").read_text()
    assert json.loads((out / "bisect.json").read_text())["first_bad"]["sha"] == shas[13]
    assert not (out / "worktree").exists(), "the private worktree must be removed"
    assert _git(repo, "rev-parse", "HEAD") == shas[-1], "the user's checkout must not move"


def test_infra_failures_are_skipped_never_bad(tmp_path):
    """A commit whose run hits an infra error (exit 2) is skipped; the culprit is still found."""
    repo, shas = make_history(tmp_path, broken=(9, 10))
    result = run_bisect(config(repo, tmp_path, shas[0], shas[-1]))
    assert result.first_bad is not None and result.first_bad.sha == shas[13]
    outcomes = {s["sha"]: s["outcome"] for s in result.steps}
    assert all(outcomes[s] == "skip" for s in (shas[9], shas[10]) if s in outcomes)
    assert all(o != "bad" for s, o in outcomes.items() if s in shas[:13])


def test_cache_is_reused_on_a_second_bisect(tmp_path):
    """Results are cached per commit sha: a second bisect over the same range runs nothing new."""
    repo, shas = make_history(tmp_path)
    first = run_bisect(config(repo, tmp_path, shas[0], shas[-1]))
    shutil.rmtree(tmp_path / "out")
    second = run_bisect(config(repo, tmp_path, shas[0], shas[-1]))
    assert second.first_bad == first.first_bad
    assert second.steps and all(s["cached"] for s in second.steps)


def _documented_exit_codes() -> dict[int, str]:
    """The exit codes `pdcheck --help` lists, each with its text (continuation lines joined)."""
    text = CliRunner().invoke(cli, ["--help"]).output.split("Exit codes", 1)[1]
    docs: dict[int, str] = {}
    for line in text.splitlines()[1:]:
        if m := re.match(r"\s+(\d+)\s{2}(.*)", line):
            code = int(m[1])
            docs[code] = m[2]
        elif docs and line.startswith(" " * 5):
            docs[code] += " " + line.strip()
        else:
            break
    return docs


def _pdcheck_bisect(root, **history) -> int:
    repo, shas = make_history(root, **history)
    predicate = shlex.join([sys.executable, "-c", PREDICATE])
    argv = ["bisect", "--vllm-repo", str(repo), "--good", shas[0], "--bad", shas[-1]]
    return main([*argv, "--cmd", predicate, "--install", "none", "--out", str(root / "out")])


def test_pdcheck_bisect_exits_as_its_help_says(tmp_path, monkeypatch):
    """Found the first bad commit: 0; only skipped commits left: 1, as `pdcheck --help` says."""
    monkeypatch.setenv("PDCHECK_CACHE_DIR", str(tmp_path / "cache"))
    found = _pdcheck_bisect(tmp_path / "found")
    only_skipped = _pdcheck_bisect(tmp_path / "skipped", broken=(12,))
    docs = _documented_exit_codes()
    assert "bisect found the first bad commit" in docs[found], docs
    assert "bisect was left with only skipped commits" in docs[only_skipped], docs
    bisect_help = CliRunner().invoke(cli, ["bisect", "--help"]).output
    exits = " ".join(bisect_help.split("Exit: ", 1)[1].split("\n\n", 1)[0].split())
    assert f"{found} the first bad commit was found" in exits
    assert f"{only_skipped} only skipped commits were left" in exits
