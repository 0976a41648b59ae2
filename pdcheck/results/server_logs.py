"""Tracebacks in the server logs of a run folder: evidence, since a clean stop leaves none.

pdcheck stops a server by signalling its leader first (`serving.process`), so a vLLM server
that ran and stopped cleanly logs no traceback; one in a log is a crash, a failed request or a
shutdown that went wrong, and the report names it. vLLM prefixes each line of a process other
than the API server, and each logged line, with `(EngineCore pid=N) ERROR <date> <time>
[file:line] `; the prefix is dropped so a traceback reads as Python printed it.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

__all__ = ["LogTraceback", "ServerLogs", "cell_server_logs", "find_tracebacks"]

_PREFIX = re.compile(
    r"^(?:\([^()]*pid=\d+\) )?(?:(?:DEBUG|INFO|WARNING|ERROR|CRITICAL) \S+ \S+ \[[^\]]*\] )?"
)
_START = "Traceback (most recent call last):"


@dataclass(frozen=True)
class LogTraceback:
    """One traceback: the log it is in, the line it starts on (1-based), the error that ends it."""

    log: str
    line: int
    error: str

    def describe(self) -> str:
        return f"`{self.log}` line {self.line}: {self.error}"


@dataclass(frozen=True)
class ServerLogs:
    """The server logs of one cell that were read, and the tracebacks they hold."""

    logs: tuple[str, ...]
    tracebacks: tuple[LogTraceback, ...]


def find_tracebacks(text: str, *, log: str) -> list[LogTraceback]:
    """Every traceback in `text`, with the exception line that ends it ("" when the log ends first)."""
    lines = [_PREFIX.sub("", raw, count=1) for raw in text.splitlines()]
    found = []
    for i, line in enumerate(lines):
        if line.strip() != _START:
            continue
        error = ""
        for rest in lines[i + 1 :]:
            # The frames are indented; the first line that is not ends the traceback.
            if rest.strip() and not rest.startswith((" ", "\t")):
                error = rest.strip()
                break
        found.append(LogTraceback(log, i + 1, error))
    return found


def cell_server_logs(logs: Sequence[Path]) -> ServerLogs | None:
    """The cell's server logs (`RunResults.log_files`) and their tracebacks; None when the
    cell kept no logs (attach mode, or a folder copied without them)."""
    if not logs:
        return None
    found = [
        tb
        for path in logs
        for tb in find_tracebacks(path.read_text(errors="replace"), log=path.name)
    ]
    return ServerLogs(tuple(p.name for p in logs), tuple(found))
