"""Stop pdcheck's server process groups when pdcheck dies, however it dies.

pdcheck starts every server in a process group of its own and stops the group on the way out
of a `with` block, on Ctrl-C and on SIGTERM. A SIGKILL (an OOM kill, a CI runner's timeout, a
`kill -9`) runs none of that. So, with its first server, pdcheck starts this file as a small
stdlib-only process (`python -I reaper.py GRACE_S`, in a group of its own, so the terminal's
Ctrl-C is pdcheck's to handle) and tells it of each group as it starts and stops, one line each
(`+PGID`, `-PGID`) on its standard input. The end of that input means pdcheck is gone, since
only pdcheck holds the pipe's other end: the reaper then sends SIGTERM to every group still
listed, waits up to GRACE_S for them to empty, SIGKILLs what is left, and exits. After a normal
exit no group is listed, and it exits at once.

A group holds the whole server: the launcher pdcheck started, and what it started (vLLM's
EngineCore and workers, or, through the CPU fork server, the forked API server and its
EngineCore, which join the launcher's group).
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterable
from pathlib import Path

log = logging.getLogger(__name__)

DEFAULT_GRACE_S = 10.0
_POLL_S = 0.1


def signal_group(pgid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def group_alive(pgid: int) -> bool:
    """True while any process of the group exists (a zombie leader counts until reaped)."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def stop_groups(pgids: set[int], *, grace_s: float) -> None:
    """SIGTERM every group, wait up to `grace_s` for all to empty, SIGKILL the rest."""
    for pgid in pgids:
        signal_group(pgid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    alive = {p for p in pgids if group_alive(p)}
    while alive and time.monotonic() < deadline:
        time.sleep(_POLL_S)
        alive = {p for p in alive if group_alive(p)}
    for pgid in alive:
        signal_group(pgid, signal.SIGKILL)


def listed_groups(lines: Iterable[str]) -> set[int]:
    """Follow `+PGID`/`-PGID` lines to their end; the groups still listed then."""
    listed: set[int] = set()
    for raw in lines:
        line = raw.strip()
        sign, number = line[:1], line[1:]
        if not number.isdigit():
            continue
        if sign == "+":
            listed.add(int(number))
        elif sign == "-":
            listed.discard(int(number))
    return listed


def main(argv: list[str]) -> None:
    grace_s = float(argv[0]) if argv else DEFAULT_GRACE_S
    # Ctrl-C and a closed terminal are pdcheck's to handle; this process acts on its input's end.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    left = listed_groups(sys.stdin)
    if left:
        print(
            f"pdcheck exited with {len(left)} process group(s) of its own (servers, fork "
            "servers) still running; stopping them: " + " ".join(map(str, sorted(left))),
            file=sys.stderr,
            flush=True,
        )
        stop_groups(left, grace_s=grace_s)


class Reaper:
    """pdcheck's side: starts the reaper process on first use and keeps its list current."""

    def __init__(self, *, grace_s: float = DEFAULT_GRACE_S) -> None:
        self.grace_s = grace_s
        self._lock = threading.Lock()
        self._process: subprocess.Popen[bytes] | None = None
        self._pgids: set[int] = set()

    def watch(self, pgid: int) -> None:
        with self._lock:
            self._pgids.add(pgid)
            self._send(f"+{pgid}\n")

    def unwatch(self, pgid: int) -> None:
        with self._lock:
            self._pgids.discard(pgid)
            self._send(f"-{pgid}\n")

    def _send(self, line: str) -> None:
        for _attempt in range(2):
            process = self._running()
            assert process.stdin is not None
            try:
                process.stdin.write(line.encode())
                process.stdin.flush()
                return
            except OSError:
                # It died (someone killed it): a new one is given the whole list first.
                log.warning(
                    "pdcheck's server reaper (pid %d) is gone; starting another", process.pid
                )
                self._process = None
        log.error("could not hand server groups to a reaper; a SIGKILL of pdcheck would leave them")

    def _running(self) -> subprocess.Popen[bytes]:
        if self._process is None or self._process.poll() is not None:
            self._process = subprocess.Popen(
                [sys.executable, "-I", str(Path(__file__)), str(self.grace_s)],
                stdin=subprocess.PIPE,
                stdout=subprocess.DEVNULL,
                process_group=0,
            )
            if self._pgids:
                assert self._process.stdin is not None
                self._process.stdin.write("".join(f"+{p}\n" for p in sorted(self._pgids)).encode())
        return self._process


if __name__ == "__main__":
    main(sys.argv[1:])
