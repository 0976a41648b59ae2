"""`pdcheck bisect` on a git history of a real release tree names the commit that brings the
zeroing race back.

The history is 0.31.0's own `vllm/` tree (from its wheel, as a checkout of that tag holds it),
then an unrelated commit, then the commit that takes the zeroing skip out of the scheduler
(what every release before 0.26.0 did), then another unrelated one. Each step lays the commit's
Python over the installed build and judges it with the real harness.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from pdcheck.bisect.overlay import extract_python, fetch_wheel
from pdcheck.cli import main
from pdcheck.config import cache_dir

pytestmark = [pytest.mark.history, pytest.mark.vllm]

RELEASE = "0.31.0"
SCHED = "vllm/v1/core/sched/scheduler.py"
SKIP = (
    "if self.needs_kv_cache_zeroing:\n"
    "                        # Skip zeroing of the blocks the async load will"
)
NO_SKIP = "if False:\n                        # Skip zeroing of the blocks the async load will"


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(
        ["git", "-C", str(repo), *args], check=True, capture_output=True, text=True
    ).stdout.strip()


def _commit(repo: Path, message: str) -> str:
    _git(repo, "add", "-A")
    _git(repo, "commit", "-q", "-m", message)
    return _git(repo, "rev-parse", "HEAD")


def make_release_history(root: Path) -> list[str]:
    repo = root / "vllm"
    wheel = fetch_wheel(RELEASE, cache_dir() / "vllm-releases" / "wheels", python=sys.executable)
    extract_python(wheel, repo)
    _git(repo, "init", "-q", "-b", "main")
    _git(repo, "config", "user.name", "t")
    _git(repo, "config", "user.email", "t@t")
    shas = [_commit(repo, f"vLLM {RELEASE}")]
    readme = repo / "vllm" / "NOTES.txt"
    readme.write_text("an unrelated change\n")
    shas.append(_commit(repo, "unrelated"))
    sched = repo / SCHED
    source = sched.read_text()
    assert source.count(SKIP) == 1, f"{RELEASE}'s scheduler no longer has its zeroing skip"
    sched.write_text(source.replace(SKIP, NO_SKIP))
    shas.append(_commit(repo, "scheduler: zero every new block again"))
    readme.write_text("another unrelated change\n")
    shas.append(_commit(repo, "unrelated again"))
    return shas


def test_bisect_names_the_commit_that_brings_the_zeroing_race_back(tmp_path, monkeypatch):
    shas = make_release_history(tmp_path)
    monkeypatch.setenv("PDCHECK_CACHE_DIR", str(tmp_path / "cache"))
    out = tmp_path / "out"
    argv = ["bisect", "--vllm-repo", str(tmp_path / "vllm"), "--good", shas[0], "--bad", shas[3]]
    argv += ["--race", "--seeds", "2", "--requests", "150", "--variant", "attention-zeroing"]
    # The ends are a release and that release with the race put back; testing them would cost
    # two more vLLM imports. The release bisect test checks ends on real releases.
    argv += ["--trust-endpoints", "--out", str(out)]
    code = main(argv)
    result = json.loads((out / "bisect.json").read_text())
    assert code == 0, result
    assert result["first_bad"]["sha"] == shas[2]
    assert {s["sha"]: s["outcome"] for s in result["steps"]}.get(shas[2]) == "bad"
