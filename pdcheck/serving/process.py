"""One server process: started in its own process group, readiness by /health, teardown of the group.

Teardown sends SIGTERM to the group's leader, waits for it to exit, then SIGTERMs what is left of
the group, and SIGKILLs whatever outlives the grace period before reaping the leader. vLLM spawns
engine and worker processes, which stay in the group, so killing the group leaves nothing
behind. The leader goes first because vLLM's API server stops its own engine core on SIGTERM:
signalled together, the engine core exits first and the API server logs an `EngineDeadError`
traceback for what was a clean stop, so that every log would hold a traceback.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

from pdcheck.errors import ServerCrashed, ServerStartTimeout
from pdcheck.serving.reaper import Reaper, group_alive, signal_group

log = logging.getLogger(__name__)

LOG_TAIL_LINES = 40
DEFAULT_GRACE_S = 15.0
POLL_INTERVAL_S = 0.25
# Stops every group this process started if it dies without its teardown (SIGKILL). One per
# process by design: it lives as long as this process's end of a pipe does.
REAPER = Reaper()


class Terminated(SystemExit):
    """pdcheck itself got SIGTERM; raised in the main thread so every `with` block tears down."""

    def __init__(self) -> None:
        super().__init__(128 + signal.SIGTERM)


class ShuttingDown(Exception):
    """pdcheck is stopping: raised in a thread that waits on servers (for /health, or for
    answers through an eval's watchdog), so it unwinds and stops them instead of waiting on."""


# Set by Ctrl-C or SIGTERM inside `signals_unwind` (from the signal handler, before the main
# thread unwinds, since the main thread may be joining the very threads that must stop), and
# cleared when the outermost `signals_unwind` ends.
SHUTTING_DOWN = threading.Event()


def check_not_shutting_down() -> None:
    if SHUTTING_DOWN.is_set():
        raise ShuttingDown("pdcheck is stopping (Ctrl-C or SIGTERM)")


class ServerProcess:
    """A server subprocess in its own process group, with its output in one log file.

    Use as a context manager: entering starts it (without waiting), leaving stops the group.
    `own_session=False` keeps the group in pdcheck's session, where a process outside it can
    join the group (a vLLM fork server's fork does, `pdcheck.serving.forkserver`).
    """

    # The machine that runs it, when not pdcheck's own (a Ray node: its id and address).
    node: str | None = None

    def __init__(
        self,
        argv: Sequence[str],
        *,
        name: str,
        url: str,
        log_path: str | Path,
        env: Mapping[str, str] | None = None,
        grace_s: float = DEFAULT_GRACE_S,
        own_session: bool = True,
    ):
        self.argv = list(argv)
        self.name = name
        self.url = url.rstrip("/")
        self.log_path = Path(log_path)
        self.env = dict(env or {})
        self.grace_s = grace_s
        self.own_session = own_session
        self._proc: subprocess.Popen | None = None
        self._terminated = False

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc else None

    def start(self) -> ServerProcess:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as logf:
            self._proc = subprocess.Popen(
                self.argv,
                env=server_environ(self.env),
                stdin=subprocess.DEVNULL,
                stdout=logf,
                stderr=subprocess.STDOUT,
                start_new_session=self.own_session,
                process_group=None if self.own_session else 0,
            )
        REAPER.watch(self._proc.pid)
        log.info("started %s (pid %d): %s", self.name, self._proc.pid, " ".join(self.argv))
        return self

    def returncode(self) -> int | None:
        return None if self._proc is None else self._proc.poll()

    def check_alive(self) -> None:
        """Raise `ServerCrashed` (with the log's tail) if the process has exited."""
        rc = self.returncode()
        if self._proc is not None and rc is not None:
            raise ServerCrashed(self.name, rc, self.log_tail(), str(self.log_path))

    def is_healthy(self, *, timeout_s: float = 2.0) -> bool:
        try:
            with urllib.request.urlopen(f"{self.url}/health", timeout=timeout_s) as resp:
                return resp.status == 200
        except (urllib.error.URLError, OSError, ValueError):
            return False

    def wait_ready(self, timeout_s: float) -> None:
        """Block until /health answers 200; `ServerCrashed` at once if the process exits first."""
        wait_all_ready([self], timeout_s=timeout_s)

    def log_tail(self, lines: int = LOG_TAIL_LINES) -> str:
        try:
            with open(self.log_path, "rb") as f:
                f.seek(0, os.SEEK_END)
                f.seek(max(0, f.tell() - 64 * 1024))
                text = f.read().decode("utf-8", "replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def terminate(self) -> None:
        """Send SIGTERM to the leader without waiting (so several servers stop in parallel)."""
        proc = self._proc
        if proc is not None and proc.poll() is None and not self._terminated:
            # Once only: a second SIGTERM makes uvicorn force its exit mid-shutdown.
            self._terminated = True
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGTERM)

    def stop(self) -> int | None:
        """SIGTERM the leader and wait for it, then SIGTERM the rest of the group, SIGKILL what
        outlives the grace period, reap."""
        proc = self._proc
        if proc is None:
            return None
        pgid = proc.pid  # a new session or process group makes the child its group's leader
        deadline = time.monotonic() + self.grace_s
        self.terminate()
        while time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.05)
        signal_group(pgid, signal.SIGTERM)
        while time.monotonic() < deadline and _group_alive(pgid, proc):
            time.sleep(0.05)
        if _group_alive(pgid, proc):
            log.warning(
                "%s did not stop within %.0f s of SIGTERM; sending SIGKILL", self.name, self.grace_s
            )
            signal_group(pgid, signal.SIGKILL)
        rc = proc.wait()
        REAPER.unwatch(pgid)
        log.info("stopped %s (exit %s)", self.name, rc)
        return rc

    def __enter__(self) -> ServerProcess:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def server_environ(env: Mapping[str, str]) -> dict[str, str]:
    """The whole environment a server with these added variables runs in."""
    # Unbuffered, so the log (and a crash report's tail) is current.
    return {**os.environ, "PYTHONUNBUFFERED": "1", **env}


def stop_all(servers: Sequence[ServerProcess]) -> None:
    """SIGTERM every server first, then wait for (or kill) each: one grace period, not one per server."""
    for server in servers:
        server.terminate()
    for server in servers:
        server.stop()


def wait_all_ready(servers: Sequence[ServerProcess], *, timeout_s: float) -> None:
    """Wait for every server's /health; the first one to exit fails the whole wait at once."""
    deadline = time.monotonic() + timeout_s
    pending = list(servers)
    while pending:
        check_not_shutting_down()
        for server in list(pending):
            server.check_alive()
            if server.is_healthy():
                pending.remove(server)
                log.info("%s is ready at %s", server.name, server.url)
        if not pending:
            return
        if time.monotonic() >= deadline:
            late = pending[0]
            raise ServerStartTimeout(late.name, timeout_s, late.log_tail(), str(late.log_path))
        time.sleep(POLL_INTERVAL_S)


def _on_sigint(signum: int, frame: object) -> None:
    SHUTTING_DOWN.set()
    raise KeyboardInterrupt


def _on_sigterm(signum: int, frame: object) -> None:
    SHUTTING_DOWN.set()
    raise Terminated()


@contextlib.contextmanager
def signals_unwind() -> Iterator[None]:
    """While active (main thread only), Ctrl-C raises KeyboardInterrupt and SIGTERM raises
    `Terminated`, so `with` blocks tear down, and both set `SHUTTING_DOWN`, so threads that
    wait on servers stop waiting."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous_term = signal.signal(signal.SIGTERM, _on_sigterm)
    previous_int = signal.getsignal(signal.SIGINT)
    if previous_int is not signal.SIG_IGN:  # a Ctrl-C this process was told to ignore stays ignored
        signal.signal(signal.SIGINT, _on_sigint)
    try:
        yield
    finally:
        # A sweep may close a scope entered on the main thread from a worker thread (a kept
        # prefill topology stopped for the next cell's); only the main thread may set handlers,
        # and the main thread's own enclosing scope restores them when it ends.
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, previous_term)
            signal.signal(signal.SIGINT, previous_int)
            if previous_term is not _on_sigterm:  # the outermost scope: the run is over
                SHUTTING_DOWN.clear()


def _group_alive(pgid: int, proc: subprocess.Popen) -> bool:
    """True while any process of the group exists; reaps the leader once it has exited."""
    proc.poll()
    return group_alive(pgid)
