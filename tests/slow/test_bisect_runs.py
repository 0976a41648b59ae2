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
    root: Path,
    n: int = 20,
    *,
    bug_at: int = 13,
    broken: tuple[int, ...] = (),
    bug_until: int | None = None,
) -> tuple[Path, list[str]]:
    """n commits of vllm/thing.py: BUG from bug_at on (or, with bug_until, before it), BROKEN
    at the `broken` indices."""
    repo = root / "vllm-repo"
    (repo / "vllm").mkdir(parents=True)
    _git(repo, "init", "-q", "-b", "main")
    _git(repo, "config", "user.name", "t")
    _git(repo, "config", "user.email", "t@t")
    shas = []
    for i in range(n):
        buggy = i < bug_until if bug_until is not None else i >= bug_at
        state = "BUG" if buggy else "ok"
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


# --- issue 39 item 5/6: endpoints, --find fix, cached import skips, the overlay --------------

INCOMPATIBLE = (
    "import sys; t = open('vllm/thing.py').read(); "
    "print('VllmIncompatible: vLLM x is not compatible with pdcheck\\'s adapter; missing: '"
    "'no_such_module_pdcheck_test:Scheduler.schedule. Update pdcheck/_vllm') if 'BROKEN' in t "
    "else None; sys.exit(1 if 'BUG' in t else 2 if 'BROKEN' in t else 0)"
)


def _main_bisect(repo: Path, shas: list[str], out: Path, *extra: str, predicate=PREDICATE) -> int:
    argv = ["bisect", "--vllm-repo", str(repo), "--good", shas[0], "--bad", shas[-1]]
    cmd = shlex.join([sys.executable, "-c", predicate])
    return main([*argv, "--cmd", cmd, "--install", "none", "--out", str(out), *extra])


def test_find_fix_names_the_first_fixed_commit(tmp_path, monkeypatch):
    """--find fix: old commits fail the predicate, new ones pass; the first passing is named."""
    monkeypatch.setenv("PDCHECK_CACHE_DIR", str(tmp_path / "cache"))
    repo, shas = make_history(tmp_path, bug_until=7)
    assert _main_bisect(repo, shas, tmp_path / "out", "--find", "fix") == 0
    result = json.loads((tmp_path / "out" / "bisect.json").read_text())
    assert result["first_bad"]["sha"] == shas[7] and result["find"] == "fix"
    assert "First fixed commit" in (tmp_path / "out" / "bisect.md").read_text()


def test_an_endpoint_that_contradicts_find_exits_3_and_one_untestable_exits_2(
    tmp_path, monkeypatch, capsys
):
    """Both ends are tested first: the 34-commit run never tested its bad end and blamed 22."""
    monkeypatch.setenv("PDCHECK_CACHE_DIR", str(tmp_path / "cache"))
    repo, shas = make_history(tmp_path / "a")
    assert _main_bisect(repo, shas, tmp_path / "o1", "--find", "fix") == 3
    assert "old endpoint" in capsys.readouterr().err
    repo, shas = make_history(tmp_path / "b", broken=(19,))
    assert _main_bisect(repo, shas, tmp_path / "o2") == 2
    assert "new endpoint --bad" in capsys.readouterr().err
    assert _git(repo, "worktree", "list").count("\n") == 0, "the private worktree is removed"


def test_import_breaks_are_named_and_cached_and_no_bad_commit_is_said_so(tmp_path, monkeypatch):
    """Skips for an import break are cached like good and bad; a run with no bad commit before
    the bad end says so instead of 'one of N'."""
    monkeypatch.setenv("PDCHECK_CACHE_DIR", str(tmp_path / "cache"))
    repo, shas = make_history(tmp_path, n=8, bug_at=7, broken=(3, 4, 5, 6))
    assert _main_bisect(repo, shas, tmp_path / "o1", predicate=INCOMPATIBLE) == 1
    steps = [json.loads(ln) for ln in (tmp_path / "o1" / "steps.jsonl").read_text().splitlines()]
    skips = [s for s in steps if s["outcome"] == "skip"]
    assert skips and all(
        "does not import: no_such_module_pdcheck_test" in s["reason"] for s in skips
    )
    md = (tmp_path / "o1" / "bisect.md").read_text()
    assert "No bad commit was found before the new endpoint" in md
    assert _main_bisect(repo, shas, tmp_path / "o2", predicate=INCOMPATIBLE) == 1
    again = [json.loads(ln) for ln in (tmp_path / "o2" / "steps.jsonl").read_text().splitlines()]
    assert again and all(s["cached"] for s in again), "skips must come from the cache too"


def test_the_commit_overlay_never_links_an_installed_py_file(tmp_path):
    """An installed package (`mm/cache/`) must not shadow the commit's `mm/cache.py`."""
    from pdcheck.bisect.step import build_overlay

    repo = tmp_path / "repo"
    (repo / "vllm" / "mm").mkdir(parents=True)
    _git(repo, "init", "-q", "-b", "main")
    _git(repo, "config", "user.name", "t")
    _git(repo, "config", "user.email", "t@t")
    (repo / "vllm" / "__init__.py").write_text("commit")
    (repo / "vllm" / "mm" / "cache.py").write_text("commit module")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-q", "-m", "c")
    installed = tmp_path / "site" / "vllm"
    for rel in ("__init__.py", "extra.py", "_C.abi3.so", "mm/cache/__init__.py", "mm/cache/d.json"):
        (installed / rel).parent.mkdir(parents=True, exist_ok=True)
        (installed / rel).write_text("installed")
    root = build_overlay(repo, _git(repo, "rev-parse", "HEAD"), installed, tmp_path / "ov")
    files = {str(p.relative_to(root / "vllm")) for p in (root / "vllm").rglob("*") if p.is_file()}
    assert files == {"__init__.py", "mm/cache.py", "_C.abi3.so"}
    assert (root / "vllm" / "_C.abi3.so").is_symlink()
