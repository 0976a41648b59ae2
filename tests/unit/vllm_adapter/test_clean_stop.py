"""The clean-stop order: in abort mode the output handler is cancelled before the engine stops.

vLLM's `AsyncLLM.shutdown` runs in an executor thread while the event loop goes on; the engine's
sockets close under a handler still waiting for outputs, which logs an EngineDeadError traceback
at every clean stop. Here a stand-in handler waits on a queue the stand-in shutdown puts an error
in, as the engine's closing socket does: wrapped, the handler ends cancelled and logs nothing.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable

from pdcheck._vllm.clean_stop import handler_first


class StandInEngine:
    """An AsyncLLM's shape: an output handler task, and a shutdown that kills its engine."""

    def __init__(self, loop: asyncio.AbstractEventLoop):
        self.outputs: asyncio.Queue[Exception] = asyncio.Queue()
        self.logged: list[str] = []
        self.loop = loop

        async def output_handler() -> None:
            try:
                raise await self.outputs.get()
            except Exception as exc:
                self.logged.append(f"AsyncLLM output_handler failed: {exc!r}")

        self.output_handler = loop.create_task(output_handler())

    def shutdown(self, timeout: float | None = None) -> None:
        # The engine core is gone: its socket's error reaches the handler's queue.
        self.loop.call_soon_threadsafe(self.outputs.put_nowait, RuntimeError("EngineDeadError"))


def _stop_from_executor(shutdown: Callable[..., None], timeout: float | None) -> StandInEngine:
    """Run the shutdown as vLLM's launcher does: in an executor thread, the loop running."""
    loop = asyncio.new_event_loop()
    engine = StandInEngine(loop)

    async def stop() -> None:
        await loop.run_in_executor(None, lambda: shutdown(engine, timeout=timeout))
        await asyncio.wait([engine.output_handler], timeout=5)

    thread = threading.Thread(target=loop.run_until_complete, args=(stop(),))
    thread.start()
    thread.join(10)
    loop.close()
    return engine


def test_abort_mode_cancels_the_handler_before_the_engine_stops():
    engine = _stop_from_executor(handler_first(StandInEngine.shutdown), 0)
    assert engine.output_handler.cancelled() and engine.logged == []


def test_vllms_own_order_logs_the_error_and_drain_mode_keeps_it():
    """Without the wrapper (and in drain mode, where outputs are still to deliver) the handler
    sees the dead engine and logs: what the wrapper exists to prevent, and where it steps back."""
    assert _stop_from_executor(StandInEngine.shutdown, 0).logged
    assert _stop_from_executor(handler_first(StandInEngine.shutdown), 5).logged
