"""Scheduler trace recorder: with ``PDCHECK_TRACE_DIR`` set, the scheduler process writes a JSONL event log.

Why: the block-reuse and zeroing races leave no trace in a server's logs. The recorder writes what
the scheduler did to KV blocks (steps dispatched and processed, block ids per request, frees and
their fences, the zero list, connector loads) so ``pdcheck trace check`` can find hazard windows
after the fact. Hooks live in ``pdcheck._vllm.scheduler.trace_hooks``; this module only encodes.
Only processes that build a Scheduler write a file. Importing this module does not import vLLM.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import time
from collections.abc import Iterator, Mapping
from typing import Any, TextIO

from pdcheck.vllm_plugin.trace_format import SCHEMA_VERSION, encode, trace_file_name

logger = logging.getLogger(__name__)
ENV_VAR = "PDCHECK_TRACE_DIR"
_FLUSH_EVERY = 256  # lines; also at least once a second, so a killed server loses little
_FLUSH_INTERVAL_S = 1.0

_installed: contextlib.ExitStack | None = None


class TraceRecorder:
    """Writes one process's events; the file opens when the first scheduler starts."""

    def __init__(self, directory: str) -> None:
        self.directory = directory
        self._fh: TextIO | None = None
        self._steps = 0
        self._processed = 0
        self._pending = 0
        self._flushed_at = time.monotonic()

    def _write(self, event: dict[str, Any]) -> None:
        if self._fh is None:
            os.makedirs(self.directory, exist_ok=True)
            self._fh = open(os.path.join(self.directory, trace_file_name(os.getpid())), "a")  # noqa: SIM115 - closed in close()
        self._fh.write(encode(event))
        self._pending += 1
        if self._pending >= _FLUSH_EVERY or time.monotonic() - self._flushed_at > _FLUSH_INTERVAL_S:
            self.flush()

    def flush(self) -> None:
        if self._fh is not None:
            self._fh.flush()
        self._pending = 0
        self._flushed_at = time.monotonic()

    def close(self) -> None:
        if self._fh is not None:
            self._fh.close()
            self._fh = None

    def on_start(self, groups: Any, defer_block_free: bool, needs_zeroing: bool) -> None:
        import vllm

        self._steps = self._processed = 0
        self._write(
            {
                "e": "start",
                "schema_version": SCHEMA_VERSION,
                "pid": os.getpid(),
                "t": time.time(),
                "vllm": getattr(vllm, "__version__", "unknown"),
                "groups": [[g.kind, g.block_size] for g in groups],
                "defer_block_free": defer_block_free,
                "needs_zeroing": needs_zeroing,
            }
        )

    def on_step(self, record: Any) -> None:
        self._steps += 1
        event: dict[str, Any] = {"e": "step", "i": self._steps, "fence": record.fence_seq, "t": time.time(), "reqs": record.requests}
        # Empty lists are left out: most steps start no load, zero nothing and finish nothing.
        if record.zero_block_ids:
            event["zero"] = record.zero_block_ids
        if record.loads:
            event["loads"] = [[ld.request_id, ld.block_ids, ld.start, ld.end] for ld in record.loads]
        if record.finished_ids:
            event["finished"] = record.finished_ids
        if record.preempted_ids:
            event["preempted"] = record.preempted_ids
        self._write(event)

    def on_processed(self, num_tokens: int, ok: set[str], failed: set[str], invalid: set[int]) -> None:
        self._processed += 1
        event: dict[str, Any] = {"e": "done", "i": self._processed, "t": time.time(), "n": num_tokens}
        if ok:
            event["ok"] = sorted(ok)
        if failed:
            event["failed"] = sorted(failed)
        if invalid:
            event["invalid"] = sorted(invalid)
        self._write(event)

    def on_free(self, record: Any) -> None:
        self._write({"e": "free", "rid": record.request_id, "deferred": record.deferred, "fence": record.fence_seq, "t": time.time()})


@contextlib.contextmanager
def recording(directory: str) -> Iterator[TraceRecorder]:
    """Record every Scheduler built inside the block into ``directory``."""
    from pdcheck._vllm.scheduler import TraceSink, trace_hooks

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
        logger.info("pdcheck: recording scheduler traces to %s", directory)
    return True
