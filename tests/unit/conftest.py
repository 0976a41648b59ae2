"""The unit tier starts no child process: an attempt fails the test and names what it started.

A child process costs the tier its speed (a `python -m pdcheck._vllm...` probe that imports
vLLM is 6-16 s of CPU) and its isolation, so tests/README.md sends such tests to tests/slow.
The guard patches the points every way of starting a process goes through: `subprocess.Popen`
(which `subprocess.run`, `os.popen` and asyncio's subprocesses use), `os.fork` (multiprocessing's
fork start method, `os.spawn*`), `os.forkpty`, `os.posix_spawn[p]` and `os.system`.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable, Generator, Iterator
from dataclasses import dataclass, field
from typing import NoReturn

import pytest

_OS_STARTERS = ("fork", "forkpty", "posix_spawn", "posix_spawnp", "system")
_CALL_FAILED = pytest.StashKey[bool]()


@dataclass
class ChildProcessGuard:
    """The refusals one unit test met, kept so a refusal its code swallowed still fails it."""

    nodeid: str
    refusals: list[str] = field(default_factory=list)

    def refuse(self, starter: str, command: object) -> NoReturn:
        message = (
            f"{self.nodeid} started a child process ({starter}: {command!r}); the unit tier "
            "starts none (tests/README.md). Move the test to tests/slow/, or give the code a "
            "seam (an argument, an injected inventory) so the test needs no process."
        )
        self.refusals.append(message)
        # pytest.fail raises a BaseException, which the `except Exception` or `except OSError`
        # around a probe does not catch, so the test stops where the process would have started.
        pytest.fail(message)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report = yield
    if report.when == "call":
        item.stash[_CALL_FAILED] = report.failed
    return report


@pytest.fixture(autouse=True)
def no_child_processes(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> Iterator[ChildProcessGuard]:
    """Fail any unit test that starts a child process, even one whose code swallows the error."""
    guard = ChildProcessGuard(request.node.nodeid)

    def refused_popen(self: object, args: object, *rest: object, **kwargs: object) -> NoReturn:
        __tracebackhide__ = True
        guard.refuse("subprocess.Popen", args)

    def refused_os_call(starter: str) -> Callable[..., NoReturn]:
        def refused(*args: object, **kwargs: object) -> NoReturn:
            __tracebackhide__ = True
            guard.refuse(f"os.{starter}", list(args))

        return refused

    monkeypatch.setattr(subprocess.Popen, "__init__", refused_popen)
    for starter in _OS_STARTERS:
        if hasattr(os, starter):
            monkeypatch.setattr(os, starter, refused_os_call(starter))
    yield guard
    if guard.refusals and not request.node.stash.get(_CALL_FAILED, False):
        # The code under test caught the failure (an `except BaseException`, a thread that died
        # of it), so the test passed without its process: fail it here instead.
        pytest.fail(guard.refusals[0], pytrace=False)
