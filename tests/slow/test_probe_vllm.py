"""`probe_vllm` reads a release wheel's version, commit and race fixes without importing vLLM.

A stand-in `vllm` install (dist-info plus the files the probe reads) goes first on the child
python's path. (Moved from tests/unit/serving: each check runs the probe in a child python.)
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from pdcheck.serving.environment import probe_vllm


def _fake_release(root: Path, commit_line: str) -> Path:
    files = {
        "vllm/__init__.py": "",
        "vllm/_version.py": f"__version__ = version = '0.32.0'\n{commit_line}\n",
        "vllm/v1/core/sched/scheduler.py": "self.defer_block_free = False\n",
        "vllm/v1/core/kv_cache_manager.py": "def allocate_slots(self, skip_zeroing_group_ids=()): ...\n",
        "vllm-0.32.0.dist-info/METADATA": "Metadata-Version: 2.1\nName: vllm\nVersion: 0.32.0\n",
    }
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root


@pytest.mark.parametrize(
    ("commit_line", "commit"),
    [
        (
            "__commit_id__ = commit_id = 'g5df63a720'",
            "5df63a720",
        ),  # how vLLM's release wheels write it
        ("__commit_id__ = commit_id = '5df63a720'", "5df63a720"),
        ("__commit_id__ = commit_id = None", None),
    ],
)
def test_release_commit_is_the_bare_hash(tmp_path, monkeypatch, commit_line, commit):
    """The commit is reported without git-describe's `g` prefix, so it can be pasted into `git show`."""
    monkeypatch.setenv("PYTHONPATH", str(_fake_release(tmp_path, commit_line)))
    env = probe_vllm(sys.executable)
    assert (env.vllm_dist, env.vllm_version, env.vllm_commit) == ("vllm", "0.32.0", commit)
    assert env.fixes == {"block-reuse": True, "zeroing": True}
