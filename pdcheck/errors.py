"""pdcheck's exceptions and exit codes, in one place.

Hierarchy (what callers catch is a base class)::

    PdcheckError                      exit 2 unless a subclass says otherwise
    ├── ConfigError                   exit 3: a sweep file or option is wrong; nothing started
    │   └── InputFileError            a file pdcheck reads is malformed: its path, line and the problem
    │       ├── ResultsFileError      a results folder's file is unreadable or of an unsupported version
    │       └── SweepFileError        with file, line and dotted key path
    │           └── SweepFileErrors   several, each with its own line and key path
    ├── DatasetError                  exit 2: GSM8K could not be loaded; says how to provide it
    ├── InfraError                    exit 2: the machinery failed, not the model
    │   ├── ServerFailure             a server failed: its role, log path and log tail
    │   │   ├── ServerCrashed         a server process exited before or while serving
    │   │   └── ServerStartTimeout    a server never answered /health in time
    │   ├── PortUnavailable           a port we need is taken
    │   └── GpuInventoryError         the topology needs more GPUs than there are
    ├── VllmIncompatible              exit 2: the installed vLLM lacks internals pdcheck needs
    ├── HarnessError                  exit 2: the race harness could not run
    └── BisectError                   exit 3: bisect input is wrong (not a repo, bad refs, dirty tree)

A verdict (PASS, REGRESSION, ...) is a result, not an exception; the CLI maps verdicts to
exit codes through :class:`ExitCode`.
"""

from __future__ import annotations

import enum

__all__ = [
    "BisectError",
    "ConfigError",
    "DatasetError",
    "ExitCode",
    "GpuInventoryError",
    "HarnessError",
    "InfraError",
    "InputFileError",
    "PdcheckError",
    "PortUnavailable",
    "ResultsFileError",
    "ServerCrashed",
    "ServerFailure",
    "ServerStartTimeout",
    "SweepFileError",
    "SweepFileErrors",
    "VllmIncompatible",
]


class ExitCode(enum.IntEnum):
    """Process exit codes, shared by every command (documented in `pdcheck --help`).

    `pdcheck bisect` exits OK when it found the first bad commit, FAILED when only skipped
    commits were left, INFRA when git named none. Its steps (`python -m pdcheck.bisect.step`)
    exit as `git bisect run` expects instead: 0 good, 1 bad, BISECT_SKIP.
    """

    OK = 0  # all pass (canaries flagged), harness clean, bisect found the culprit
    FAILED = 1  # REGRESSION/SUSPECT, an unflagged canary, race findings, bisect: only skips left
    INFRA = 2  # INFRA-ERROR, crashed servers, no KV transferred, harness could not run
    CONFIG = 3  # bad input (sweep file, options, a malformed file to read); nothing was started
    BISECT_SKIP = 125  # a bisect step's "skip": the commit cannot be tested


class PdcheckError(Exception):
    """Base of every error pdcheck raises on purpose."""

    exit_code: ExitCode = ExitCode.INFRA


class ConfigError(PdcheckError, ValueError):
    """Bad input: a sweep file, option or argument that pdcheck refuses before starting anything."""

    exit_code = ExitCode.CONFIG


class InputFileError(ConfigError):
    """A file pdcheck reads (records, a results folder's JSON, a sweep file, a log) is malformed.

    Says `path:line: problem` (the line when the file is read line by line); a malformed file is
    the user's input, so it exits 3 like any other bad input, never with a traceback.
    """

    def __init__(self, problem: str, *, path: object, line: int | None = None):
        self.path = str(path)
        self.line = line
        self.problem = problem
        where = self.path if line is None else f"{self.path}:{line}"
        super().__init__(f"{where}: {problem}")


class SweepFileError(InputFileError):
    """A sweep file is invalid; carries where (file, line, key path) and what is allowed."""

    def __init__(self, message: str, *, path: str, line: int | None = None, key: str | None = None):
        self.key = key
        super().__init__(f"{key}: {message}" if key else message, path=path, line=line)


class SweepFileErrors(SweepFileError):
    """Every problem found in one sweep file, each a `SweepFileError` with its own line and key path.

    The first problem's file, line and key are this error's own, so code that reads one still works."""

    def __init__(self, problems: list[SweepFileError]):
        self.problems = tuple(problems)
        first = problems[0]
        self.path, self.line, self.key = first.path, first.line, first.key
        self.problem = first.problem
        lines = [f"{len(problems)} problems in {first.path}:", *(f"  {p}" for p in problems)]
        ConfigError.__init__(self, "\n".join(lines))


class DatasetError(PdcheckError):
    """The evaluation data could not be loaded; the message says how to provide it."""


class InfraError(PdcheckError):
    """The serving machinery failed; a run that hits this gets INFRA-ERROR, never PASS."""


class ServerFailure(InfraError):
    """A server pdcheck started failed to serve; carries its role, the tail of its log and the
    log's path, and says all three (the log tail is what a reader needs first)."""

    def __init__(self, role: str, problem: str, *, log_tail: str = "", log_path: str | None = None):
        self.role = role
        self.log_tail = log_tail
        self.log_path = log_path
        msg = f"{role} {problem}"
        if log_path:
            msg += f" (log: {log_path})"
        if log_tail:
            msg += f"\n--- last lines of its log ---\n{log_tail}"
        super().__init__(msg)


class ServerCrashed(ServerFailure):
    """A server process exited; carries its role, exit code and the tail of its log."""

    def __init__(
        self, role: str, returncode: int | None, log_tail: str = "", log_path: str | None = None
    ):
        self.returncode = returncode
        super().__init__(
            role, f"exited with code {returncode}", log_tail=log_tail, log_path=log_path
        )


class ServerStartTimeout(ServerFailure):
    """A server did not become healthy within its timeout."""

    def __init__(
        self, role: str, timeout_s: float, log_tail: str = "", log_path: str | None = None
    ):
        self.timeout_s = timeout_s
        super().__init__(
            role,
            f"did not answer /health within {timeout_s:g} s; raise the ready timeout for slow models",
            log_tail=log_tail,
            log_path=log_path,
        )


class PortUnavailable(InfraError):
    """A port pdcheck needs is already bound by someone else."""


class GpuInventoryError(InfraError):
    """The topology needs more GPUs than the inventory has; nothing was started."""

    exit_code = ExitCode.CONFIG


class VllmIncompatible(PdcheckError):
    """The installed vLLM cannot be driven: outside the supported range, an import that fails, or
    internals pdcheck relies on missing (every missing name listed), with the version."""

    def __init__(self, version: str, missing: list[str], *, reason: str | None = None):
        self.version = version
        self.missing = list(missing)
        detail = reason or (
            "missing: " + ", ".join(self.missing) + ". Update pdcheck/_vllm for this version"
        )
        super().__init__(f"vLLM {version} is not compatible with pdcheck's adapter; {detail}.")


class HarnessError(PdcheckError):
    """The race harness could not run (vLLM missing or incompatible, bad workload)."""


class ResultsFileError(InputFileError):
    """A results folder's file cannot be read: not JSON, an unsupported schema version, or a wrong shape.

    Names the file; nothing is started or written.
    """


class BisectError(PdcheckError):
    """Bisect cannot start: not a git repo, unknown refs, good not an ancestor of bad, dirty tree."""

    exit_code = ExitCode.CONFIG
