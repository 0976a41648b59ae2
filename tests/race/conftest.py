"""In-process vLLM for the race tests: imported and checked once per xdist worker."""

from __future__ import annotations

import os

import pytest

# CI sizes: enough seeds for the assertions below, small enough for the 3-minute budget.
CI_SEEDS = 8
CI_REQUESTS = 120


@pytest.fixture(scope="session")
def adapter():
    """The adapter's start-up check module, after the check passed (import vLLM once; fail, never skip, when incompatible)."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from pdcheck._vllm import internals
    from pdcheck.race.run import prepare_vllm

    prepare_vllm()
    return internals
