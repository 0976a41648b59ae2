"""The trace recorder queues on the scheduler's thread and writes on its own: same lines as the format, in order, flushed.

No vLLM: the hooks' records (TraceStep, LoadStart, FreeRecord) are built by hand, as trace_hooks builds them.
"""

from __future__ import annotations

import itertools
import json
import logging
import os
import threading
import time
from types import SimpleNamespace

import pytest

from pdcheck._vllm.records import FreeRecord, LoadStart, TraceStep
from pdcheck.vllm_plugin import trace_recorder
from pdcheck.vllm_plugin.trace_format import read_trace_dir
from pdcheck.vllm_plugin.trace_recorder import TraceRecorder


def _step(i: int) -> TraceStep:
    return TraceStep(
        fence_seq=i,
        new_rows=[(f"new-{i}", 0, 17, ((1, 2), (3,)), "new")],
        counts={f"new-{i}": 17, f'c-é"{i}': 1, "r": 4},
        cached_ids=[f'c-é"{i}', "r"],
        cached_starts=[40, 8],
        cached_blocks=[None, ((5,), ())],
        resumed=frozenset({"r"}),
        zero_block_ids=(9, 8) if i % 2 else (),
        loads=(LoadStart(f"load-{i}", ((4, 5),), 0, 32),) if i % 3 == 0 else (),
        finished_ids=("b", "a") if i % 4 == 0 else (),
        preempted_ids=("z", "y") if i % 5 == 0 else (),
    )


def _expected_step(i: int, t: float) -> dict:
    """The step event as the synchronous recorder built it: lists, sorted id lists, empty lists left out."""
    event = {
        "e": "step",
        "i": i,
        "fence": i,
        "t": t,
        "reqs": [
            [f"new-{i}", 0, 17, [[1, 2], [3]], "new"],
            [f'c-é"{i}', 40, 1, None, "cached"],
            ["r", 8, 4, [[5], []], "resumed"],
        ],
    }
    if i % 2:
        event["zero"] = [9, 8]
    if i % 3 == 0:
        event["loads"] = [[f"load-{i}", [[4, 5]], 0, 32]]
    if i % 4 == 0:
        event["finished"] = ["a", "b"]
    if i % 5 == 0:
        event["preempted"] = ["y", "z"]
    return event


def _lines(directory) -> list[str]:
    (name,) = os.listdir(directory)
    with open(os.path.join(directory, name)) as fh:
        return fh.read().splitlines(keepends=True)


def _ticking_clock(monkeypatch) -> itertools.count:
    """The recorder's clock reads 1000.0, 1001.0, ... one tick per hook call, so event times are known."""
    ticks = itertools.count(1000.0)
    monkeypatch.setattr(trace_recorder, "time", SimpleNamespace(time=ticks.__next__))
    return itertools.count(1000.0)


def test_lines_are_the_queued_events_in_hook_order(tmp_path, monkeypatch):
    """Queued records become one JSON line per event, in the order the hooks were called, sets sorted."""
    clock = _ticking_clock(monkeypatch)
    rec = TraceRecorder(str(tmp_path))
    expected = []
    for i in range(1, 31):
        rec.on_step(_step(i))
        expected.append(_expected_step(i, next(clock)))
        ok, failed, invalid = (
            (frozenset({"q2", "q1"}), frozenset({"q3"}), frozenset({7, 3}))
            if i % 6 == 0
            else (frozenset(),) * 3
        )
        rec.on_processed(18 + i, ok, failed, invalid)
        done = {"e": "done", "i": i, "t": next(clock), "n": 18 + i}
        if i % 6 == 0:
            done |= {"ok": ["q1", "q2"], "failed": ["q3"], "invalid": [3, 7]}
        expected.append(done)
        if i % 7 == 0:
            rec.on_free(FreeRecord(f"new-{i}", bool(i % 2), i))
            expected.append(
                {
                    "e": "free",
                    "rid": f"new-{i}",
                    "deferred": bool(i % 2),
                    "fence": i,
                    "t": next(clock),
                }
            )
    rec.close()
    lines = _lines(tmp_path)
    assert all(line.endswith("\n") for line in lines)
    assert [json.loads(line) for line in lines] == expected, "pdcheck trace check reads these lines"
    assert [e["e"] for tf in read_trace_dir(str(tmp_path)) for e in tf.events][:3] == [
        "step",
        "done",
        "step",
    ]


def test_hooks_only_queue_and_the_writer_thread_flushes_without_close(tmp_path, monkeypatch):
    """The scheduler's thread never encodes or writes; without any close the writer thread puts the lines on disk.

    How soon (the bar is a second) is the flush interval's job, not a timed assertion here: on a
    loaded CI box a thread may wait longer than that to run.
    """
    encoding_threads = set()
    real_encode = trace_recorder.encode

    def spy_encode(event):
        encoding_threads.add(threading.current_thread().name)
        return real_encode(event)

    monkeypatch.setattr(trace_recorder, "encode", spy_encode)
    rec = TraceRecorder(str(tmp_path))
    for i in range(1, 301):
        rec.on_step(_step(i))
        rec.on_processed(1, frozenset(), frozenset(), frozenset())
    try:
        deadline = time.monotonic() + 60.0
        while time.monotonic() < deadline and (
            not os.listdir(tmp_path) or len(_lines(tmp_path)) < 600
        ):
            time.sleep(0.02)
        assert len(_lines(tmp_path)) == 600, "a killed server must lose only the last interval"
        assert encoding_threads == {"pdcheck-trace-writer"}, encoding_threads
    finally:
        rec.close()
    assert len(_lines(tmp_path)) == 600


def test_close_drains_everything_and_lines_stay_in_order_under_a_concurrent_writer(
    tmp_path, monkeypatch
):
    """Events queued while the writer is draining are written after the ones before them; close leaves nothing queued."""
    monkeypatch.setattr(trace_recorder, "_FLUSH_INTERVAL_S", 0.001)
    monkeypatch.setattr(trace_recorder, "_CHUNK", 7)
    rec = TraceRecorder(str(tmp_path))
    for i in range(1, 5001):
        rec.on_step(_step(i))
    rec.close()
    assert [json.loads(line)["i"] for line in _lines(tmp_path)] == list(range(1, 5001))


def test_a_failing_writer_stops_recording_and_close_says_so(tmp_path, caplog):
    """A write error does not reach the scheduler's thread; events stop piling up and close() raises."""
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("")
    rec = TraceRecorder(str(blocker / "trace"))
    with caplog.at_level(logging.ERROR, logger=trace_recorder.__name__):
        rec.on_step(_step(1))
        deadline = time.monotonic() + 60.0
        while "trace recording" not in caplog.text and time.monotonic() < deadline:
            time.sleep(0.01)
    assert "stopped" in caplog.text, "the writer thread reports its failure"
    for i in range(2, 100):
        rec.on_step(_step(i))  # no exception on the scheduler's thread
    rec.drain()  # would raise on the unwritable path if any event had been kept
    with pytest.raises(RuntimeError, match="trace is incomplete"):
        rec.close()


def test_hook_records_are_copies_the_worker_cannot_change():
    """trace_step copies block id lists: an in-process worker extends new and resumed requests' lists in place."""
    from types import SimpleNamespace

    from pdcheck._vllm.capture import trace_step

    new_ids = ([1, 2], [3])
    resumed_ids = ([7],)
    output = SimpleNamespace(
        num_scheduled_tokens={"a": 5, "b": 1, "c": 2},
        scheduled_new_reqs=[SimpleNamespace(req_id="a", num_computed_tokens=0, block_ids=new_ids)],
        scheduled_cached_reqs=SimpleNamespace(
            req_ids=["b", "c"],
            resumed_req_ids={"c"},
            num_computed_tokens=[9, 4],
            new_block_ids=[None, resumed_ids],
        ),
        new_block_ids_to_zero=[4],
        finished_req_ids={"x"},
        preempted_req_ids=None,
    )
    step = trace_step(SimpleNamespace(sched_step_seq=3), output, ())
    new_ids[0].append(99)
    resumed_ids[0].append(98)
    output.new_block_ids_to_zero.append(5)
    output.num_scheduled_tokens["b"] = 0
    output.scheduled_cached_reqs.req_ids.append("d")
    assert step.rows() == [
        ("a", 0, 5, ((1, 2), (3,)), "new"),
        ("b", 9, 1, None, "cached"),
        ("c", 4, 2, ((7,),), "resumed"),
    ]
    assert (step.fence_seq, step.zero_block_ids, step.finished_ids, step.preempted_ids) == (
        3,
        (4,),
        ("x",),
        (),
    )
