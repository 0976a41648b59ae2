"""The unit tier's guard (tests/unit/conftest.py) refuses every way of starting a child process."""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess

import pytest

from tests.unit.conftest import ChildProcessGuard


def _start_with_asyncio() -> None:
    async def start() -> None:
        await asyncio.create_subprocess_exec("true")

    asyncio.run(start())


def _fork_and_leave() -> None:
    # If the guard let the fork through, the child must not go on running the test session.
    if os.fork() == 0:
        os._exit(0)


@pytest.mark.parametrize(
    ("start", "named"),
    [
        (lambda: subprocess.run(["true"], check=False), r"subprocess\.Popen: \['true'\]"),
        (lambda: os.popen("true"), r"subprocess\.Popen: 'true'"),
        (_start_with_asyncio, r"subprocess\.Popen: \('true',\)"),
        (_fork_and_leave, r"os\.fork: \[\]"),
        (lambda: os.system("true"), r"os\.system: \['true'\]"),
        (lambda: os.posix_spawn("/bin/true", ["true"], {}), r"os\.posix_spawn: \['/bin/true'"),
    ],
    ids=["subprocess.run", "os.popen", "asyncio", "os.fork", "os.system", "os.posix_spawn"],
)
def test_starting_a_process_fails_the_test_naming_the_command_and_tests_slow(
    start, named, no_child_processes: ChildProcessGuard
):
    """Each way of starting a process fails the test with the command and where the test belongs."""
    with pytest.raises(pytest.fail.Exception, match=named + r".*Move the test to tests/slow/"):
        start()
    assert len(no_child_processes.refusals) == 1
    no_child_processes.refusals.clear()  # refused on purpose: this test passes


def test_a_refusal_the_code_swallows_is_still_kept(no_child_processes: ChildProcessGuard):
    """Code that catches BaseException around a probe cannot hide the attempt from the teardown."""
    with contextlib.suppress(BaseException):
        subprocess.run(["nvidia-smi", "-L"], check=False)
    assert no_child_processes.refusals[0].startswith(
        "tests/unit/test_no_child_processes.py::test_a_refusal_the_code_swallows_is_still_kept "
        "started a child process (subprocess.Popen: ['nvidia-smi', '-L'])"
    )
    no_child_processes.refusals.clear()
