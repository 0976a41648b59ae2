"""signals_unwind closed on another thread than the one that entered it (a sweep stopping a kept
prefill topology, started on the main thread, from the worker thread of the next cell's job)."""

from __future__ import annotations

import signal
import threading

from pdcheck.serving.process import signals_unwind


def test_a_scope_entered_on_the_main_thread_can_close_on_a_worker_thread():
    """Closing it on a worker thread raises nothing (only the main thread may set handlers: it
    once raised ValueError and failed the next cell's PD job), and leaves the handlers as they are."""
    before = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)
    scope = signals_unwind()
    scope.__enter__()
    errors: list[BaseException] = []

    def close() -> None:
        try:
            scope.__exit__(None, None, None)
        except BaseException as exc:  # the failure this test pins
            errors.append(exc)

    worker = threading.Thread(target=close)
    worker.start()
    worker.join()
    try:
        assert errors == []
    finally:
        signal.signal(signal.SIGTERM, before[0])
        signal.signal(signal.SIGINT, before[1])
