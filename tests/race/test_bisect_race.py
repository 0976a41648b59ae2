"""`pdcheck bisect --race` judges a real vLLM commit: the one step the bisect unit tests cannot take.

tests/unit/bisect covers the search, skip, cache and policy logic with a plain command as the
predicate. What only this test covers is a step on real vLLM source: the commit's Python laid
over the installed vLLM (no build), then the real race harness run against it. Each history is
built from the installed vLLM's own scheduler source and has three commits, so `git bisect`
runs exactly one step, on the middle commit.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from pdcheck.cli import main
from pdcheck.serving.environment import probe_vllm

pytestmark = pytest.mark.vllm

SCHED = "vllm/v1/core/sched/scheduler.py"
# The source edit that removes the block-reuse fix, as a regression would.
FIX = "                self.defer_block_free = True"
NO_FIX = "                self.defer_block_free = False"


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(
        ["git", "-C", str(repo), *args], check=True, capture_output=True, text=True
    ).stdout.strip()


def _not_python(folder: str, names: list[str]) -> set[str]:
    return {
        n
        for n in names
        if n == "__pycache__" or (not n.endswith(".py") and not (Path(folder) / n).is_dir())
    }


def make_history(root: Path, *, middle: str) -> list[str]:
    """Three commits of the installed vLLM's Python tree: as installed (good), `middle`, and the
    fix removed (bad). The whole tree, as a real checkout has: the overlay takes only compiled
    and data files from the installed package, never a module the commit lacks."""
    installed = Path(probe_vllm().vllm_path)
    source = (installed.parent / SCHED).read_text()
    assert FIX in source, "the installed scheduler no longer has the block-reuse fix's code"
    without_fix = source.replace(FIX, NO_FIX)
    texts = {
        "fix removed": without_fix,
        "does not import": source + "\nthis line is not python\n",
    }
    repo = root / "vllm"
    repo.mkdir()
    shutil.copytree(installed, repo / "vllm", ignore=_not_python)
    _git(repo, "init", "-q", "-b", "main")
    _git(repo, "config", "user.name", "t")
    _git(repo, "config", "user.email", "t@t")
    shas = []
    for i, text in enumerate((source, texts[middle], without_fix)):
        (repo / SCHED).write_text(text + f"\n# synthetic commit {i}\n")
        _git(repo, "add", "-A")
        _git(repo, "commit", "-q", "-m", f"commit {i}")
        shas.append(_git(repo, "rev-parse", "HEAD"))
    return shas


def _bisect(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, middle: str) -> tuple[int, dict, list]:
    monkeypatch.setenv("PDCHECK_CACHE_DIR", str(tmp_path / "cache"))
    shas = make_history(tmp_path, middle=middle)
    out = tmp_path / "out"
    argv = ["bisect", "--vllm-repo", str(tmp_path / "vllm"), "--good", shas[0], "--bad", shas[2]]
    argv += ["--race", "--seeds", "2", "--requests", "150", "--variant", "attention"]
    # The ends are known (the installed scheduler, and it with the fix removed); testing them
    # would cost two more vLLM imports per test. tests/slow covers the endpoint checks.
    argv += ["--trust-endpoints"]
    code = main([*argv, "--out", str(out)])
    return code, json.loads((out / "bisect.json").read_text()), shas


def test_a_commit_without_the_fix_is_judged_bad_by_the_real_harness(tmp_path, monkeypatch):
    """The overlay puts the commit's scheduler in front of the installed one: the race is found there."""
    code, result, shas = _bisect(tmp_path, monkeypatch, "fix removed")
    assert code == 0
    assert [(s["sha"], s["outcome"]) for s in result["steps"]] == [(shas[1], "bad")]
    assert result["first_bad"]["sha"] == shas[1]


def test_a_commit_that_does_not_import_is_skipped_never_bad(tmp_path, monkeypatch):
    """vLLM failing to import the commit's source is an infra skip with the reason, not a bad commit."""
    code, result, shas = _bisect(tmp_path, monkeypatch, "does not import")
    # Only the skipped commit and the bad end are left: either could be first, so no culprit.
    assert code == 1 and result["first_bad"] is None
    assert sorted(result["candidates"]) == sorted(shas[1:])
    (step,) = result["steps"]
    assert step["sha"] == shas[1] and step["outcome"] == "skip"
    assert "does not import" in step["reason"]
