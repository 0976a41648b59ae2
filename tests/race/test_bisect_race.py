"""`pdcheck bisect --race` names the commit that removed a race fix, on a synthetic vLLM history.

The history is built from the installed vLLM's own scheduler source: ~20 commits, with one fix
removed at a known commit and one commit that does not import. Each step lays the commit's
Python over the installed vLLM (no build) and runs the real race harness.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from pdcheck.cli import main
from pdcheck.serving.environment import probe_vllm

pytestmark = pytest.mark.vllm

SCHED = "vllm/v1/core/sched/scheduler.py"
# The source edits that remove each fix, as a regression would.
REMOVE_FIX = {
    "block-reuse": (
        "                self.defer_block_free = True",
        "                self.defer_block_free = False",
    ),
    "zeroing": (
        "                        self.connector.get_loaded_kv_cache_group_ids(request)\n"
        "                        if load_kv_async and self.connector is not None\n"
        "                        else ()",
        "                        ()",
    ),
}


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(
        ["git", "-C", str(repo), *args], check=True, capture_output=True, text=True
    ).stdout.strip()


def make_history(
    root: Path, fix: str, *, regress_at: int, broken_at: int, n: int = 20
) -> list[str]:
    installed = Path(probe_vllm().vllm_path)
    source = (installed.parent / SCHED).read_text()
    old, new = REMOVE_FIX[fix]
    assert old in source, (
        f"the installed scheduler no longer has the {fix} fix's code; update REMOVE_FIX"
    )
    repo = root / "vllm"
    (repo / Path(SCHED).parent).mkdir(parents=True)
    _git(repo, "init", "-q", "-b", "main")
    _git(repo, "config", "user.name", "t")
    _git(repo, "config", "user.email", "t@t")
    shas = []
    for i in range(n):
        text = source.replace(old, new) if i >= regress_at else source
        if i == broken_at:
            text += "\nthis line is not python\n"
        (repo / SCHED).write_text(text + f"\n# synthetic commit {i}\n")
        _git(repo, "add", "-A")
        _git(repo, "commit", "-q", "-m", f"commit {i}")
        shas.append(_git(repo, "rev-parse", "HEAD"))
    return shas


@pytest.mark.parametrize(
    ("fix", "variant"), [("block-reuse", "attention"), ("zeroing", "attention-zeroing")]
)
def test_bisect_race_names_the_commit_that_removed_the_fix(tmp_path, monkeypatch, fix, variant):
    """The first bad commit is exactly the one that removed the fix; the unimportable one is skipped."""
    monkeypatch.setenv("PDCHECK_CACHE_DIR", str(tmp_path / "cache"))
    shas = make_history(tmp_path, fix, regress_at=12, broken_at=5)
    out = tmp_path / "out"
    argv = [
        "bisect",
        "--vllm-repo",
        str(tmp_path / "vllm"),
        "--good",
        shas[0],
        "--bad",
        shas[-1],
        "--race",
        "--seeds",
        "2",
        "--requests",
        "150",
        "--variant",
        variant,
        "--out",
        str(out),
    ]
    assert main(argv) == 0
    import json

    result = json.loads((out / "bisect.json").read_text())
    assert result["first_bad"]["sha"] == shas[12]
    steps = {s["sha"]: s for s in result["steps"]}
    if shas[5] in steps:
        assert steps[shas[5]]["outcome"] == "skip", (
            "a commit that does not import is skipped, never bad"
        )

    # A second bisect over the same range reuses every cached step.
    (out / "bisect.json").unlink()
    import shutil

    shutil.rmtree(out)
    assert main(argv) == 0
    again = json.loads((out / "bisect.json").read_text())
    assert again["first_bad"]["sha"] == shas[12]
    assert all(s["cached"] for s in again["steps"])
