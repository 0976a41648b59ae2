"""`probe_vllm` reads a release wheel's version and commit without importing vLLM, and its race
fixes through the fix switches' own attribute resolution.

A stand-in `vllm` install (dist-info plus the files the probe reads) goes first on the child
python's path. (Moved from tests/unit/serving: each check runs the probe in a child python.)
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from pdcheck.serving.environment import probe_vllm

# A scheduler whose source names both fixes' markers (in a comment), as a release that
# mentions them without having them would.
_MENTIONS_ONLY = {
    "vllm/v1/core/sched/scheduler.py": "class Scheduler:\n    # defer_block_free: not here yet\n    pass\n",
    "vllm/v1/core/kv_cache_manager.py": "class KVCacheManager:\n    # skip_zeroing_group_ids\n    def allocate_slots(self, request): ...\n",
}
_HAS_FIXES = {
    "vllm/v1/core/sched/scheduler.py": (
        "class Scheduler:\n"
        "    def _request_blocks_can_be_freed(self, request): ...\n"
        "    def _drain_deferred_frees(self): ...\n"
    ),
    "vllm/v1/core/kv_cache_manager.py": (
        "class KVCacheManager:\n"
        "    def pop_blocks_for_free(self, request): ...\n"
        "    def allocate_slots(self, request, skip_zeroing_group_ids=()): ...\n"
        "    def record_blocks_for_zeroing(self, blocks): ...\n"
    ),
}
# 0.26.0-0.31.0's shape: the deferred free without `_request_blocks_can_be_freed` (0.30.0 on),
# and the zeroing fix as a per-block skip list, before 0.32.0 reworked it into group ids.
_OLDER_FORMS = {
    "vllm/v1/core/sched/scheduler.py": (
        "class Scheduler:\n"
        "    def _drain_deferred_frees(self): ...\n"
        "    def _get_new_block_ids_to_zero(self): ...\n"
    ),
    "vllm/v1/core/kv_cache_manager.py": (
        "class KVCacheManager:\n"
        "    def pop_blocks_for_free(self, request): ...\n"
        "    def allocate_slots(self, request): ...\n"
        "    def get_zeroing_block_ids_in_range(self, request_id, start, end): ...\n"
        "    def record_blocks_for_zeroing(self, request_id, start_token): ...\n"
    ),
}
_NEWEST = {
    "block-reuse": {"state": "present", "form": "deferred-free"},
    "zeroing": {"state": "present", "form": "skip-zeroing-group-ids"},
}
_OLDER = {
    "block-reuse": {"state": "present", "form": "deferred-free"},
    "zeroing": {"state": "present", "form": "skip-zero-block-ids"},
}
_ABSENT = {
    "block-reuse": {"state": "absent", "form": None},
    "zeroing": {"state": "absent", "form": None},
}
# A release after both fixes landed whose names match no form pdcheck knows (a rework): unknown,
# never absent, so that a switch is refused rather than a silent no-op.
_UNKNOWN = {
    "block-reuse": {"state": "unknown", "form": None},
    "zeroing": {"state": "unknown", "form": None},
}


def _fake_release(
    root: Path, commit_line: str, sources: dict[str, str] = _HAS_FIXES, version: str = "0.32.0"
) -> Path:
    files = {
        "vllm/__init__.py": f"__version__ = '{version}'\n",
        "vllm/_version.py": f"__version__ = version = '{version}'\n{commit_line}\n",
        **sources,
        f"vllm-{version}.dist-info/METADATA": f"Metadata-Version: 2.1\nName: vllm\nVersion: {version}\n",
    }
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    for package in ("vllm/v1", "vllm/v1/core", "vllm/v1/core/sched"):
        (root / package / "__init__.py").touch()
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


def _plugin_answer() -> dict[str, dict]:
    """What the fix switches themselves resolve in the child python (pdcheck._vllm.versions)."""
    code = (
        "import json; from pdcheck._vllm.versions import fix_statuses; "
        "print(json.dumps({f: s.to_dict() for f, s in fix_statuses().items()}))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


@pytest.mark.parametrize(
    ("sources", "version", "fixes"),
    [
        (_HAS_FIXES, "0.32.0", _NEWEST),
        (_OLDER_FORMS, "0.31.0", _OLDER),
        (_MENTIONS_ONLY, "0.23.0", _ABSENT),
        (_MENTIONS_ONLY, "0.40.0", _UNKNOWN),
    ],
    ids=["has", "older-forms", "mentions", "unknown-form"],
)
def test_doctor_and_the_fix_switches_agree_on_which_fixes_are_present(
    tmp_path, monkeypatch, sources, version, fixes
):
    """Doctor's fixes are what the fix switches resolve in that vLLM: a release whose source only
    mentions a fix's marker words, without its methods, has the fix absent in both; 0.26-0.31's
    older zeroing fix is present, in its own form."""
    monkeypatch.setenv("PDCHECK_CACHE_DIR", str(tmp_path / "cache"))
    release = _fake_release(tmp_path, "commit_id = None", sources, version)
    monkeypatch.setenv("PYTHONPATH", str(release))
    env = probe_vllm(sys.executable, fixes=True)
    assert env.fixes == _plugin_answer() == fixes
    assert not env.fixes_cached


def test_fixes_are_probed_once_per_source_state_of_vllm(tmp_path, monkeypatch):
    """The fixes answer is cached for exactly the vLLM sources it was probed on: probing the
    same install again reads the cache, and an edit that adds the fixes to a release that
    lacked them (as a checkout of a newer commit does) is probed again, never answered stale."""
    monkeypatch.setenv("PDCHECK_CACHE_DIR", str(tmp_path / "cache"))
    release = _fake_release(tmp_path / "vllm-install", "commit_id = None", _MENTIONS_ONLY, "0.23.0")
    monkeypatch.setenv("PYTHONPATH", str(release))
    first = probe_vllm(sys.executable, fixes=True)
    again = probe_vllm(sys.executable, fixes=True)
    assert (first.fixes, first.fixes_cached) == (_ABSENT, False)
    assert (again.fixes, again.fixes_cached) == (_ABSENT, True)

    for rel, text in _HAS_FIXES.items():
        (release / rel).write_text(text)
    edited = probe_vllm(sys.executable, fixes=True)
    assert edited.vllm_source_stamp != first.vllm_source_stamp
    assert (edited.fixes, edited.fixes_cached) == (_NEWEST, False)
