"""The trace recorder hooks the real scheduler; `trace check` finds the hazard in a recorded trace with a fix off."""

from __future__ import annotations

import json
import os

import pytest

from pdcheck.race import Kind, check_trace_dir, run_race

pytestmark = pytest.mark.vllm


def test_recorded_trace_with_block_reuse_off_shows_the_hazard(adapter, tmp_path):
    """Block-reuse off: the harness run's trace holds a stale-write window; trace check reports it (exit-1 data)."""
    run_race(
        seeds=1,
        requests=60,
        variants=["attention"],
        disable_fixes=["block-reuse"],
        trace_dir=str(tmp_path),
    )
    result = check_trace_dir(str(tmp_path))
    assert result.segments == 1 and result.steps > 50
    kinds = {f.kind for f in result.findings}
    assert kinds & {Kind.STALE_WRITE_INTO_CONSUMER_BLOCK, Kind.STALE_WRITE_INTO_LOCAL_BLOCK}, kinds


def test_recorded_trace_with_zeroing_off_shows_the_hazard(adapter, tmp_path):
    """Zeroing off on a hybrid: the trace shows a step zeroing blocks an outstanding load writes."""
    run_race(
        seeds=1,
        requests=60,
        variants=["hybrid-align"],
        disable_fixes=["zeroing"],
        trace_dir=str(tmp_path),
    )
    assert Kind.ZEROING_OF_LOAD_TARGET in {f.kind for f in check_trace_dir(str(tmp_path)).findings}


def test_recorded_trace_of_shipped_vllm_is_clean_and_complete(adapter, tmp_path):
    """Shipped fixes: trace check is clean; the trace has every event kind the format promises."""
    run_race(seeds=2, requests=60, variants=["hybrid-align", "aborts"], trace_dir=str(tmp_path))
    result = check_trace_dir(str(tmp_path))
    assert result.clean, [f.detail for f in result.findings[:5]]
    assert result.segments == 4
    (name,) = os.listdir(tmp_path)
    with open(tmp_path / name) as fh:
        events = [json.loads(line) for line in fh]
    assert {e["e"] for e in events} == {"start", "step", "done", "free"}
    assert any(e["e"] == "free" and e["deferred"] for e in events), (
        "deferred frees carry their fence"
    )
    assert any(e["e"] == "step" and e.get("loads") for e in events) and any(
        e["e"] == "done" and e.get("ok") for e in events
    )
    start = events[0]
    assert start["groups"][0] == ["mamba", 16] and start["defer_block_free"] is True
