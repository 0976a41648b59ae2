"""Shared test setup: a clean environment, the gpu marker, and per-xdist-worker port bases."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

_STRIPPED_PREFIXES = ("VLLM_", "PDCHECK_", "HF_", "CUDA_VISIBLE_DEVICES", "UCX_")
_STRIPPED_NAMES = (
    "HTTP_PROXY",
    "HTTPS_PROXY",
    "ALL_PROXY",
    "NO_PROXY",
    "http_proxy",
    "https_proxy",
    "all_proxy",
    "no_proxy",
)
# Variables tests may rely on: where CI points GSM8K, where tiny models are cached, and the
# archives the release workflow hands to the install test.
_KEPT = ("PDCHECK_GSM8K_DIR", "PDCHECK_CACHE_DIR", "PDCHECK_DIST_DIR")


def _has_gpu() -> bool:
    if shutil.which("nvidia-smi") is None:
        return False
    try:
        return subprocess.run(["nvidia-smi", "-L"], capture_output=True, timeout=10).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


_SLOW_TIER = Path(__file__).parent / "slow"


def pytest_collection_modifyitems(config, items):
    # The slow tier is marked by where it lives, so a test moved there cannot forget the marker.
    for item in items:
        if _SLOW_TIER in item.path.parents:
            item.add_marker(pytest.mark.slow)
    if _has_gpu():
        return
    skip_gpu = pytest.mark.skip(reason="needs an NVIDIA GPU; none is present")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip_gpu)


@pytest.fixture(autouse=True)
def clean_environ(monkeypatch):
    """The host's VLLM_*/PDCHECK_*/HF_*/proxy variables must not change test results."""
    for name in list(os.environ):
        if name in _KEPT:
            continue
        if name.startswith(_STRIPPED_PREFIXES) or name in _STRIPPED_NAMES:
            monkeypatch.delenv(name, raising=False)


@pytest.fixture(scope="session")
def worker_index() -> int:
    """0 for the controller or gw0, N for gwN: tests derive disjoint port ranges from it."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
    return int(worker.removeprefix("gw") or 0)


@pytest.fixture(scope="session")
def gsm8k_dir():
    """The local GSM8K folder CI points at; tests that need real GSM8K use it."""
    path = os.environ.get("PDCHECK_GSM8K_DIR")
    if not path:
        here = os.path.dirname(os.path.abspath(__file__))
        candidate = os.path.normpath(os.path.join(here, "..", "..", "shared", "data", "gsm8k"))
        path = candidate if os.path.isdir(candidate) else None
    if not path or not os.path.isdir(path):
        pytest.fail(
            "GSM8K not found: set PDCHECK_GSM8K_DIR to a folder with test.jsonl and train.jsonl"
        )
    return path
