"""Stop the API server's output handler before its engine core, so a clean stop logs no traceback.

vLLM's `AsyncLLM.shutdown` (0.22.0 through 0.32.0 read alike) shuts the engine core down first
and cancels the output handler after. The launcher runs it in an executor thread while the
event loop goes on, so the handler sees the engine's sockets close, logs "AsyncLLM
output_handler failed" with an `EngineDeadError` traceback, and only then is cancelled: every
PD server's log ended in a traceback at a clean stop, which hid the ones that mean a crash.

In abort mode (`timeout == 0`, vLLM's default, which pdcheck keeps) no request is to be
answered any more, so the handler is cancelled, and its end awaited, before the original
shutdown runs; in drain mode vLLM's own order stands, since the handler still has outputs to
deliver. Installed by the plugin in every process it is active in (only the API server builds an
AsyncLLM); a release without the name keeps vLLM's order.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import Callable
from typing import Any

from pdcheck._vllm.internals import CLEAN_STOP_NAMES, missing_names, resolve
from pdcheck._vllm.patches import patched

__all__ = ["handler_first", "install_clean_stop"]

logger = logging.getLogger(__name__)

_installed = contextlib.ExitStack()
# Long enough for a loop busy with the last responses; a stalled loop keeps vLLM's order.
_CANCEL_WAIT_S = 5.0


@functools.cache
def install_clean_stop() -> bool:
    """Reorder `AsyncLLM.shutdown` for the life of the process; False when this vLLM lacks it."""
    missing = missing_names(CLEAN_STOP_NAMES)
    if missing:
        logger.info("pdcheck: no clean-stop order on this vLLM (missing %s)", ", ".join(missing))
    else:
        owner, _, attr = CLEAN_STOP_NAMES[0].rpartition(".")
        _installed.enter_context(patched(resolve(owner), attr, handler_first))
    return not missing


def handler_first(orig: Callable[..., Any]) -> Callable[..., Any]:
    """`AsyncLLM.shutdown` that, in abort mode, cancels the output handler before `orig` runs."""

    @functools.wraps(orig)
    def shutdown(self: Any, timeout: float | None = None) -> Any:
        handler = getattr(self, "output_handler", None)
        if timeout == 0 and isinstance(handler, asyncio.Task) and not handler.done():
            _cancel_and_wait(handler)
        return orig(self, timeout=timeout)

    return shutdown


def _cancel_and_wait(task: asyncio.Task) -> None:
    loop = task.get_loop()
    try:
        on_loop = asyncio.get_running_loop() is loop
    except RuntimeError:
        on_loop = False
    if on_loop or loop.is_closed() or not loop.is_running():
        # The loop cannot run the cancellation while shutdown blocks it; requested now, it is
        # what the handler meets at its next await, before any error from the engine.
        task.cancel()
        return

    async def cancelled() -> None:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task

    future = asyncio.run_coroutine_threadsafe(cancelled(), loop)
    with contextlib.suppress(Exception):
        future.result(timeout=_CANCEL_WAIT_S)
