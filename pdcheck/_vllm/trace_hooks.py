"""Trace hooks: every Scheduler built while active reports its steps, outputs, frees and loads.

The recorder (``pdcheck.vllm_plugin.trace_recorder``) gets pdcheck records, never vLLM objects.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
from collections.abc import Callable, Iterator
from typing import Any

from pdcheck._vllm.capture import capture_loads, group_infos, trace_step
from pdcheck._vllm.patches import patched, scheduler_cls
from pdcheck._vllm.records import FreeRecord, GroupInfo, LoadStart, TraceStep
from pdcheck._vllm.versions import free_method


@dataclasses.dataclass
class TraceSink:
    """Callbacks the trace hooks call, on the scheduler's thread; each gets pdcheck records or plain values.

    Every argument is a copy or immutable, so a sink may keep it and encode it later on another thread.
    """

    on_start: Callable[
        [tuple[GroupInfo, ...], bool, bool], None
    ]  # groups, defer_block_free, needs_zeroing
    on_step: Callable[[TraceStep], None]
    on_processed: Callable[
        [int, frozenset[str], frozenset[str], frozenset[int]], None
    ]  # num tokens, recving ok, failed, invalid
    on_free: Callable[[FreeRecord], None]


_NONE: frozenset[Any] = frozenset()


@contextlib.contextmanager
def trace_hooks(sink: TraceSink) -> Iterator[None]:
    """Hook every Scheduler built while active: steps, processed outputs, frees and connector loads."""
    cls = scheduler_cls()

    def init(orig: Callable[..., None]) -> Callable[..., None]:
        @functools.wraps(orig)
        def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
            orig(self, *args, **kwargs)
            self._pdcheck_trace_loads = []
            if self.connector is not None:
                capture_loads(self.connector, self._pdcheck_trace_loads)
            sink.on_start(
                group_infos(self.kv_cache_config),
                self.defer_block_free,
                self.needs_kv_cache_zeroing,
            )

        return __init__

    def schedule(orig: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(orig)
        def wrapped(self: Any, *args: Any, **kwargs: Any) -> Any:
            output = orig(self, *args, **kwargs)
            loads = getattr(self, "_pdcheck_trace_loads", None)
            taken: tuple[LoadStart, ...] = ()
            if loads:
                taken = tuple(loads)
                loads.clear()
            sink.on_step(trace_step(self, output, taken))
            return output

        return wrapped

    def update(orig: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(orig)
        def wrapped(self: Any, scheduler_output: Any, model_runner_output: Any) -> Any:
            kv = model_runner_output.kv_connector_output
            if kv is None:
                sink.on_processed(scheduler_output.total_num_scheduled_tokens, _NONE, _NONE, _NONE)
            else:
                failed = frozenset(kv.failed_recving or ())
                ok = frozenset(kv.finished_recving or ()) - failed
                sink.on_processed(
                    scheduler_output.total_num_scheduled_tokens,
                    ok,
                    failed,
                    frozenset(kv.invalid_block_ids or ()),
                )
            return orig(self, scheduler_output, model_runner_output)

        return wrapped

    def free(orig: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(orig)
        def wrapped(self: Any, request: Any) -> Any:
            can_free = getattr(self, "_request_blocks_can_be_freed", None)
            deferred = bool(can_free is not None and not can_free(request))
            sink.on_free(
                FreeRecord(request.request_id, deferred, getattr(self, "sched_step_seq", 0))
            )
            return orig(self, request)

        return wrapped

    with contextlib.ExitStack() as stack:
        stack.enter_context(patched(cls, "__init__", init))
        stack.enter_context(patched(cls, "schedule", schedule))
        stack.enter_context(patched(cls, "update_from_output", update))
        stack.enter_context(patched(cls, free_method(), free))
        yield


@contextlib.contextmanager
def timing_scheduler_calls(add: Callable[[float, float], None]) -> Iterator[None]:
    """For the trace overhead benchmark: ``add(wall_s, thread_cpu_s)`` after every Scheduler.schedule and update_from_output.

    Enter it inside ``recording()`` so that the timed calls include the trace hooks.
    """
    import time

    cls = scheduler_cls()

    def timed(orig: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(orig)
        def wrapped(self: Any, *args: Any, **kwargs: Any) -> Any:
            w, c = time.perf_counter(), time.thread_time()
            try:
                return orig(self, *args, **kwargs)
            finally:
                add(time.perf_counter() - w, time.thread_time() - c)

        return wrapped

    with patched(cls, "schedule", timed), patched(cls, "update_from_output", timed):
        yield
