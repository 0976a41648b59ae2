"""The harness on real release sources laid over the installed build (issue 39): each finding on a
release with both fixes is a real defect of that release, with the right kind, or there is none.

Runs only where an overlay of the release exists (`PDCHECK_RELEASE_OVERLAYS`, default /tmp/ov:
one directory per version holding the release's Python and links to the installed build's
compiled files; missing dependencies in `PDCHECK_RELEASE_DEPS`, default /tmp/ovdeps). The history
tier points these at the release cache.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

_REPO = Path(__file__).resolve().parents[2]


def _race(version: str, variants: list[str], tmp_path: Path, *, seeds: int = 1) -> dict:
    overlay = Path(os.environ.get("PDCHECK_RELEASE_OVERLAYS", "/tmp/ov")) / version
    if not overlay.is_dir():
        pytest.skip(f"no overlay of vLLM {version} at {overlay}")
    deps = os.environ.get("PDCHECK_RELEASE_DEPS", "/tmp/ovdeps")
    out = tmp_path / f"{version}.json"
    argv = [sys.executable, "-m", "pdcheck", "race", "--seeds", str(seeds), "--requests", "150"]
    argv += [arg for v in variants for arg in ("--variant", v)] + ["--json", str(out)]
    # A cache of its own: vLLM keys ~/.cache/vllm/modelinfos by module and class, so a release
    # rewrites the installed build's entries and the next in-process vLLM re-inspects its models in
    # a child process (which activates the plugin there too: a second activation marker).
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(overlay), deps, str(_REPO)]),
        "VLLM_CACHE_ROOT": str(tmp_path / "vllm-cache"),
    }
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode in (0, 1), proc.stdout[-2000:] + proc.stderr[-2000:]
    summary = json.loads(out.read_text())
    assert summary["vllm_version"] == version
    return {v["variant"]: v for v in summary["variants"]}


def test_0_29_is_clean_with_failed_loads_reported_by_invalid_blocks(tmp_path):
    """0.29.0 has both fixes and no failed_recving: load failures reported as invalid blocks are
    clean (reporting them as finished gave BLOCK_REUSE), and the hybrid one cannot run."""
    results = _race(
        "0.29.0",
        ["attention-zeroing", "load-failures", "hybrid-align", "hybrid-load-failures"],
        tmp_path,
    )
    assert results["hybrid-load-failures"]["unsupported"]
    found = {n: v["findings_by_kind"] for n, v in results.items() if v["seeds_with_findings"]}
    assert found == {}


def test_0_26_hybrid_findings_are_its_per_group_prefix_hit_only(tmp_path):
    """0.26.0 (both race fixes) takes max(per-group hits) as the local prefix of a hybrid with a
    connector (Scheduler.schedule, fixed in 0.27.0 by get_computed_blocks_for_connector): requests
    start from state and KV nobody computed. Only those kinds, family OTHER, are reported."""
    results = _race("0.26.0", ["hybrid-align"], tmp_path)
    kinds = set(results["hybrid-align"]["findings_by_kind"])
    assert kinds and kinds <= {"MAMBA_READ_NULL_BLOCK", "READ_UNCOMPUTED_KV"}
    assert set(results["hybrid-align"]["seeds_by_family"]) == {"OTHER"}
