"""Where a canary arm is expected to be flagged: injections everywhere, races only where they can fire."""

from __future__ import annotations

import pytest

from pdcheck.config import SweepSpec, expand_cells, level_expectation


def _cell(arm: str, *, async_scheduling: bool = True, platform: str = "gpu", kind: str = "hybrid"):
    spec = SweepSpec.model_validate(
        {
            "name": "t",
            "models": [{"name": "m", "path": "/m", "kind": kind}],
            "matrix": {
                "arms": [arm],
                "async_scheduling": [async_scheduling],
                "concurrency": [1, 2, 8],
            },
            "serving": {"platform": platform},
        }
    )
    return expand_cells(spec)[0]


@pytest.mark.parametrize("arm", ["fixes-off", "zeroing-off", "block-reuse-off"])
def test_race_canary_flags_only_with_async_and_two_in_flight(arm):
    """Async on: c1 is a control that must PASS, c2 and c8 are expected to flag."""
    cell = _cell(arm)
    assert [level_expectation(cell, c).flag for c in (1, 2, 8)] == [False, True, True]
    assert "concurrency 1" in level_expectation(cell, 1).why


@pytest.mark.parametrize("arm", ["fixes-off", "zeroing-off"])
def test_race_canary_with_async_off_is_a_control_at_every_level(arm):
    cell = _cell(arm, async_scheduling=False)
    assert not any(level_expectation(cell, c).flag for c in (1, 2, 8))
    assert "async scheduling off" in level_expectation(cell, 8).why


@pytest.mark.parametrize("arm", ["inject-zero", "inject-stale"])
def test_injection_canary_is_expected_at_every_level(arm):
    for async_scheduling in (True, False):
        cell = _cell(arm, async_scheduling=async_scheduling)
        assert all(level_expectation(cell, c).flag for c in (1, 2, 8))


def test_clean_arm_is_never_expected_to_flag():
    cell = _cell("fixes-on")
    assert not any(level_expectation(cell, c).flag for c in (1, 2, 8))


def test_cpu_cells_are_sync_because_vllm_cpu_forces_async_off():
    """A CPU sweep asking for async gets sync cells, named `sync`, and its race canaries are controls."""
    spec = SweepSpec.model_validate(
        {
            "name": "t",
            "models": [{"name": "m", "path": "/m"}],
            "matrix": {
                "arms": ["fixes-off"],
                "async_scheduling": [True, False],
                "concurrency": [1, 8],
            },
            "serving": {"platform": "cpu"},
        }
    )
    (cell,) = expand_cells(spec)
    assert not cell.async_scheduling and "-sync-" in cell.name and "async" not in cell.name
    assert not level_expectation(cell, 8).flag


def test_a_zeroing_canary_on_a_full_attention_model_is_a_control():
    """vLLM zeroes new blocks only for hybrid (Mamba) caches: zeroing-off on a full-attention
    model runs the fixes-on code at every level, so it must PASS; an arm that also switches
    off block-reuse is still expected to flag where that race can fire."""
    zeroing = _cell("zeroing-off", kind="full-attention")
    assert not any(level_expectation(zeroing, c).flag for c in (1, 2, 8))
    assert "zeroes no new block" in level_expectation(zeroing, 8).why
    both = _cell("fixes-off", kind="full-attention")
    assert [level_expectation(both, c).flag for c in (1, 2, 8)] == [False, True, True]
