"""`pdcheck trace check` on hand-written traces: hazard windows found, clean traces clean, bad input refused."""

from __future__ import annotations

import json

from click.testing import CliRunner

from pdcheck.cli import main
from pdcheck.race.findings import Kind
from pdcheck.race.trace_check import check_trace_dir

START = {
    "e": "start",
    "schema_version": 1,
    "pid": 1,
    "t": 0,
    "vllm": "0.32.0",
    "groups": [["attention", 4]],
    "defer_block_free": True,
    "needs_zeroing": True,
}


def _step(i, reqs, *, zero=(), loads=(), finished=(), preempted=()):
    return {
        "e": "step",
        "i": i,
        "fence": i,
        "t": 0,
        "reqs": reqs,
        "zero": list(zero),
        "loads": list(loads),
        "finished": list(finished),
        "preempted": list(preempted),
    }


def _done(i, ok=(), failed=()):
    return {
        "e": "done",
        "i": i,
        "t": 0,
        "n": 1,
        "ok": list(ok),
        "failed": list(failed),
        "invalid": [],
    }


def _write(tmp_path, events, name="trace-1.jsonl"):
    with open(tmp_path / name, "w") as fh:
        for e in events:
            fh.write(json.dumps(e) + "\n")
    return str(tmp_path)


def _reuse_trace(*, processed_before_reuse: bool):
    # r1 decodes into block 5 in step 2; r1 finishes; step 3 gives block 5 to loader r2.
    events = [
        START,
        _step(1, [["r1", 0, 7, [[4, 5]], "new"]]),
        _step(2, [["r1", 7, 1, None, "cached"]]),
        _done(1),
    ]
    if processed_before_reuse:
        events.append(_done(2))
    events.append({"e": "free", "rid": "r1", "deferred": False, "fence": 2, "t": 0})
    events.append(_step(3, [], loads=[["r2", [[5, 6]], 0, 8]], finished=["r1"]))
    return events


def test_block_given_away_while_its_writer_step_is_in_flight_is_a_hazard(tmp_path):
    """Reallocating a block that an unprocessed step still writes for a finished request is BLOCK_REUSE."""
    result = check_trace_dir(_write(tmp_path, _reuse_trace(processed_before_reuse=False)))
    assert [f.kind for f in result.findings] == [Kind.STALE_WRITE_INTO_CONSUMER_BLOCK]
    assert result.findings[0].blocks == (5,) and result.findings[0].culprit == "r1"


def test_same_reuse_after_the_writer_step_was_processed_is_clean(tmp_path):
    """With the fence respected (the writing step processed first) the same reuse is not a hazard."""
    assert check_trace_dir(_write(tmp_path, _reuse_trace(processed_before_reuse=True))).clean


def test_zeroing_a_load_target_with_an_older_step_in_flight_is_a_hazard(tmp_path):
    """Async: a step that zeroes blocks its own load writes, while an older step runs, is a ZEROING hazard."""
    events = [
        START,
        _step(1, [["r1", 0, 4, [[1]], "new"]]),
        _step(2, [], zero=[2, 3], loads=[["r2", [[2, 3]], 0, 8]]),
    ]
    result = check_trace_dir(_write(tmp_path, events))
    assert [f.kind for f in result.findings] == [Kind.ZEROING_OF_LOAD_TARGET]


def test_synchronous_zeroing_of_its_own_new_load_is_clean(tmp_path):
    """Sync scheduling: the zeroing runs before the load can land, so the same step is not a hazard."""
    events = [
        START,
        _step(1, [["r1", 0, 4, [[1]], "new"]]),
        _done(1),
        _step(2, [], zero=[2, 3], loads=[["r2", [[2, 3]], 0, 8]]),
    ]
    assert check_trace_dir(_write(tmp_path, events)).clean


def test_prefix_cache_sharing_with_a_live_writer_is_clean(tmp_path):
    """A block the in-flight writer still holds (a prefix-cache hit) may be shared: no hazard."""
    events = [
        START,
        _step(1, [["r1", 0, 8, [[4, 5]], "new"]]),
        _step(2, [["r2", 0, 8, [[4, 5]], "new"]]),
    ]
    assert check_trace_dir(_write(tmp_path, events)).clean


def test_cli_trace_check_exit_codes(tmp_path):
    """`pdcheck trace check`: 1 for hazards, 0 for clean, 3 for a directory without traces."""
    hazard = tmp_path / "hazard"
    clean = tmp_path / "clean"
    empty = tmp_path / "empty"
    for d in (hazard, clean, empty):
        d.mkdir()
    _write(hazard, _reuse_trace(processed_before_reuse=False))
    _write(clean, _reuse_trace(processed_before_reuse=True))
    assert main(["trace", "check", str(hazard)]) == 1
    assert main(["trace", "check", str(clean)]) == 0
    assert main(["trace", "check", str(empty)]) == 3


def test_torn_last_line_is_tolerated_but_garbage_is_refused(tmp_path):
    """A process killed mid-write leaves a torn last line (ignored); a non-JSON line elsewhere is a ConfigError exit."""
    path = tmp_path / "t"
    path.mkdir()
    text = (
        "".join(json.dumps(e) + "\n" for e in _reuse_trace(processed_before_reuse=True))
        + '{"e": "st'
    )
    (path / "trace-2.jsonl").write_text(text)
    assert check_trace_dir(str(path)).clean
    (path / "trace-3.jsonl").write_text("not json\n" + json.dumps(START) + "\n")
    assert main(["trace", "check", str(path)]) == 3


def test_race_help_lists_the_options():
    """`pdcheck race --help` documents seeds, variants, fix switches, depth and JSON output without importing vLLM."""
    result = CliRunner().invoke(__import__("pdcheck.cli.race", fromlist=["race"]).race, ["--help"])
    assert result.exit_code == 0
    for option in ("--seeds", "--variant", "--disable-fix", "--depth", "--json", "--requests"):
        assert option in result.output


def _hit_trace(start: int):
    # r1's in-flight step 2 writes block 5 (tokens 4..7); r1 is freed; step 3 gives block 5 to r3,
    # which starts computing at token `start` (a prefix-cache hit of `start` tokens).
    return [
        START,
        _step(1, [["r1", 0, 7, [[4, 5]], "new"]]),
        _step(2, [["r1", 7, 1, None, "cached"]]),
        _done(1),
        {"e": "free", "rid": "r1", "deferred": False, "fence": 2, "t": 0},
        _step(3, [["r3", start, 4, [[4, 5, 6]], "new"]], finished=["r1"]),
    ]


def test_block_reached_by_a_prefix_cache_hit_is_shared_by_content_not_a_hazard(tmp_path):
    """A block inside the new owner's computed prefix is a cache hit: the stale step writes what it expects."""
    assert check_trace_dir(_write(tmp_path, _hit_trace(start=8))).clean


def test_same_block_given_as_fresh_space_is_a_local_hazard(tmp_path):
    """The same reuse with the block past the new owner's prefix (fresh KV to compute) is a hazard."""
    result = check_trace_dir(_write(tmp_path, _hit_trace(start=0)))
    assert [f.kind for f in result.findings] == [Kind.STALE_WRITE_INTO_LOCAL_BLOCK]
