"""A fake OpenAI server whose requests hang until the test is done with it.

A fake with a long `delay_s` would make every timeout test wait that long at the end, when the
fake stops and waits for its handlers; this one lets them answer as the block ends.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from tests.fakes.openai_server import FakeOpenAIServer, Responder, echo_completion


@contextmanager
def hung_server(then: Responder = echo_completion) -> Iterator[FakeOpenAIServer]:
    """A started fake that answers no request (each answers with `then` once the block ends)."""
    released = threading.Event()

    async def hang(body: dict[str, Any]) -> Any:
        while not released.is_set():
            await asyncio.sleep(0.01)
        return then(body)

    server = FakeOpenAIServer(hang).start()
    try:
        yield server
    finally:
        released.set()
        server.stop()
