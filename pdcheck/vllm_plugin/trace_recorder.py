"""Scheduler trace recorder: with ``PDCHECK_TRACE_DIR`` set, the scheduler process writes a JSONL event log.

Why: the block-reuse and zeroing races leave no trace in a server's logs. The recorder writes what
the scheduler did to KV blocks (steps dispatched and processed, block ids per request, frees and
their fences, the zero list, connector loads) so ``pdcheck trace check`` can find hazard windows
after the fact. Hooks live in ``pdcheck._vllm.trace_hooks``; this module only encodes.
Only processes that build a Scheduler write a file. Importing this module does not import vLLM.

Cost: on the scheduler's thread the hooks only append a tuple (the hook's record and ``time.time()``)
to a deque. A writer thread encodes and writes what has queued every ``_FLUSH_INTERVAL_S`` and
flushes the file each time, so a killed server loses at most about that much (a torn last line is
tolerated by the reader). In a real engine the writer runs while the scheduler's thread waits for
the model; ``close()`` drains the queue, so a closed recorder has written everything.
"""

from __future__ import annotations

import atexit
import collections
import contextlib
import logging
import multiprocessing.util
import os
import threading
import time
from collections.abc import Iterator, Mapping
from typing import Any, BinaryIO

from pdcheck.contracts import environment
from pdcheck.vllm_plugin.trace_format import SCHEMA_VERSION, encode, trace_file_name

logger = logging.getLogger(__name__)
ENV_VAR = environment.TRACE_DIR.name
_FLUSH_INTERVAL_S = 0.25  # the writer thread drains, writes and flushes this often (the bar: at least once a second)
_CHUNK = 128  # events per write call; a write that reaches the file releases the GIL, so the scheduler waits less

_installed: contextlib.ExitStack | None = None

# Queue entry tags (first item of each queued tuple).
_START, _STEP, _DONE, _FREE = range(4)


class TraceRecorder:
    """Writes one process's events; the file opens and the writer thread starts when the first scheduler starts.

    The ``on_*`` methods run on the scheduler's thread and only queue; :meth:`drain` (the writer thread,
    :meth:`flush` and :meth:`close`) turns the queue into lines in the order the events happened.
    """

    def __init__(self, directory: str) -> None:
        self.directory = directory
        self._fh: BinaryIO | None = None
        self._steps = 0
        self._processed = 0
        self._queue: collections.deque[tuple[Any, ...]] = collections.deque()
        self._drain_lock = (
            threading.Lock()
        )  # one drainer at a time, so lines keep the queue's order
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self._closed = False

    # -- the scheduler's thread: queue only -------------------------------------------------------

    def on_start(self, groups: Any, defer_block_free: bool, needs_zeroing: bool) -> None:
        from pdcheck._vllm.internals import vllm_version

        self._steps = self._processed = 0
        event = {
            "e": "start",
            "schema_version": SCHEMA_VERSION,
            "pid": os.getpid(),
            "t": time.time(),
            "vllm": vllm_version(),
            "groups": [[g.kind, g.block_size] for g in groups],
            "defer_block_free": defer_block_free,
            "needs_zeroing": needs_zeroing,
        }
        self._queue.append((_START, event))
        self._start_writer()

    def on_step(self, record: Any) -> None:
        if self._thread is None:  # hooks installed over a scheduler built before recording() began
            self._start_writer()
        self._steps += 1
        self._queue.append((_STEP, self._steps, time.time(), record))

    def on_processed(self, num_tokens: int, ok: Any, failed: Any, invalid: Any) -> None:
        self._processed += 1
        self._queue.append((_DONE, self._processed, time.time(), num_tokens, ok, failed, invalid))

    def on_free(self, record: Any) -> None:
        self._queue.append((_FREE, time.time(), record))

    # -- the writer -----------------------------------------------------------------------------------

    def _start_writer(self) -> None:
        if self._thread is None and self._error is None and not self._closed:
            self._stop.clear()
            self._thread = threading.Thread(
                target=self._run, name="pdcheck-trace-writer", daemon=True
            )
            self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(_FLUSH_INTERVAL_S):
            try:
                self.drain()
            except BaseException as exc:
                self._fail(exc)
                return

    def _fail(self, exc: BaseException) -> None:
        self._error = exc
        self._queue = collections.deque(maxlen=0)  # later events are dropped instead of piling up
        logger.error("pdcheck: trace recording to %s stopped: %r", self.directory, exc)

    def _event(self, item: tuple[Any, ...]) -> dict[str, Any]:
        tag = item[0]
        if tag == _STEP:
            _, i, t, record = item
            event: dict[str, Any] = {
                "e": "step",
                "i": i,
                "fence": record.fence_seq,
                "t": t,
                "reqs": record.rows(),
            }
            # Empty lists are left out: most steps start no load, zero nothing and finish nothing.
            if record.zero_block_ids:
                event["zero"] = record.zero_block_ids
            if record.loads:
                event["loads"] = [
                    [ld.request_id, ld.block_ids, ld.start, ld.end] for ld in record.loads
                ]
            if record.finished_ids:
                event["finished"] = sorted(record.finished_ids)
            if record.preempted_ids:
                event["preempted"] = sorted(record.preempted_ids)
            return event
        if tag == _DONE:
            _, i, t, num_tokens, ok, failed, invalid = item
            event = {"e": "done", "i": i, "t": t, "n": num_tokens}
            if ok:
                event["ok"] = sorted(ok)
            if failed:
                event["failed"] = sorted(failed)
            if invalid:
                event["invalid"] = sorted(invalid)
            return event
        if tag == _FREE:
            _, t, record = item
            return {
                "e": "free",
                "rid": record.request_id,
                "deferred": record.deferred,
                "fence": record.fence_seq,
                "t": t,
            }
        return item[1]  # _START: built whole on the hook's side

    def drain(self) -> None:
        """Encode and write everything queued so far, then flush the file."""
        with self._drain_lock:
            queue, to_event = self._queue, self._event
            while queue:
                lines: list[bytes] = []
                while queue and len(lines) < _CHUNK:
                    lines.append(encode(to_event(queue.popleft())))
                self._file().write(b"".join(lines))
            if self._fh is not None:
                self._fh.flush()

    def _file(self) -> BinaryIO:
        if self._fh is None:
            os.makedirs(self.directory, exist_ok=True)
            self._fh = open(os.path.join(self.directory, trace_file_name(os.getpid())), "ab")  # noqa: SIM115 - closed in close()
        return self._fh

    def flush(self) -> None:
        """Write and flush everything queued so far (on the caller's thread)."""
        if self._error is None:
            self.drain()

    def close(self) -> None:
        """Stop the writer, write what is left and close the file; raises if the writer failed."""
        self._closed = True
        thread, self._thread = self._thread, None
        if thread is not None:
            self._stop.set()
            thread.join()
        try:
            self.flush()
        except BaseException as exc:
            self._fail(exc)
        if self._fh is not None:
            self._fh.close()
            self._fh = None
        if self._error is not None:
            error, self._error = self._error, None
            raise RuntimeError(
                f"pdcheck trace recorder for {self.directory} failed; the trace is incomplete"
            ) from error


@contextlib.contextmanager
def recording(directory: str) -> Iterator[TraceRecorder]:
    """Record every Scheduler built inside the block into ``directory``."""
    from pdcheck._vllm.trace_hooks import TraceSink, trace_hooks

    recorder = TraceRecorder(directory)
    sink = TraceSink(recorder.on_start, recorder.on_step, recorder.on_processed, recorder.on_free)
    try:
        with trace_hooks(sink):
            yield recorder
    finally:
        recorder.close()


def install_from_env(environ: Mapping[str, str]) -> bool:
    """Start recording for the life of the process when ``PDCHECK_TRACE_DIR`` is set; idempotent."""
    global _installed
    directory = environ.get(ENV_VAR)
    if not directory:
        return False
    if _installed is None:
        _installed = contextlib.ExitStack()
        recorder = _installed.enter_context(recording(directory))
        atexit.register(recorder.close)
        # A process multiprocessing forks from this one (vLLM's EngineCore on CUDA, and on CPU at
        # TP 1) ends with os._exit, which skips atexit: close it with multiprocessing's own exit
        # hooks, registered in the child (the fork clears the parent's).
        multiprocessing.util.register_after_fork(recorder, _close_at_exit)
        logger.info("pdcheck: recording scheduler traces to %s", directory)
    return True


def _close_at_exit(recorder: TraceRecorder) -> None:
    multiprocessing.util.Finalize(recorder, recorder.close, exitpriority=0)
