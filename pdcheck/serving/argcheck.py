"""Check `vllm serve` command lines with vLLM's own code, in a subprocess of the python that will run them.

The program is `python -m pdcheck._vllm.serve_check` (the only place that names vLLM's parser
and config internals); this module sends it each server's arguments and environment and reads
its typed answers (`pdcheck.contracts.vllm_programs`). Parsing needs no GPU, so a GPU topology
(TP 2, CUDA env) can be checked on a CPU box by `--dry-run`; building the engine config is done
only where that python's vLLM runs the servers' platform. vLLM is never imported into pdcheck's
process: `python` may be another venv's interpreter, which gets this pdcheck on its path.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Mapping, Sequence

from pdcheck.contracts.vllm_programs import (
    ServeCheck,
    ServeCheckRequest,
    ServerToCheck,
    parse_result,
)
from pdcheck.errors import InfraError
from pdcheck.serving.adapter_programs import run_adapter_program
from pdcheck.serving.process import server_environ

SERVE_CHECK_MODULE = "pdcheck._vllm.serve_check"
# Parsing is one vLLM import; each built config adds a fork that builds a model config.
_PARSE_TIMEOUT_S = 180.0
_BUILD_TIMEOUT_PER_SERVER_S = 60.0


def serve_args_of(argv: Sequence[str]) -> list[str]:
    """The arguments after `serve` in a full server argv (launcher and subcommand dropped)."""
    argv = list(argv)
    if "serve" not in argv:
        raise ValueError(f"not a `vllm serve` command line: {argv[:4]}...")
    return argv[argv.index("serve") + 1 :]


def check_serve_argv(argv: Sequence[str], python: str) -> list[str]:
    """Problems vLLM's own parser finds in a `vllm serve` argv ([] when it parses), run in `python`.

    Raises `InfraError` when `python` cannot run the check at all (no vLLM there, say).
    """
    return check_serve_argvs([argv], python)[0]


def check_serve_argvs(argvs: Sequence[Sequence[str]], python: str) -> list[list[str]]:
    """`check_serve_argv` for several command lines with one vLLM import (10-20 s each saved)."""
    return [c.problems for c in check_servers([(argv, None) for argv in argvs], python)]


def check_servers(
    servers: Sequence[tuple[Sequence[str], Mapping[str, str] | None]],
    python: str,
    *,
    device_type: str | None = None,
) -> list[ServeCheck]:
    """Each server (its argv, and the variables serving adds to its environment) through vLLM's
    parser, and, when `device_type` is given, through `create_engine_config()` as `vllm serve`
    builds it, where `python`'s vLLM runs that platform. One vLLM import for all of them.
    """
    build = device_type is not None
    request = ServeCheckRequest(
        servers=[
            ServerToCheck(
                serve_args_of(argv), server_environ(env) if build and env is not None else None
            )
            for argv, env in servers
        ],
        build_config=build,
        device_type=device_type,
    )
    timeout_s = _PARSE_TIMEOUT_S + (_BUILD_TIMEOUT_PER_SERVER_S * len(servers) if build else 0)
    try:
        proc = run_adapter_program(
            python,
            SERVE_CHECK_MODULE,
            stdin=request.to_json(),
            timeout_s=timeout_s,
            env=_quiet_env(),
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise InfraError(f"could not run vLLM's serve check in {python}: {exc}") from exc
    checks = parse_result(proc.stdout)
    if checks is None:
        tail = "\n".join(proc.stderr.strip().splitlines()[-10:])
        raise InfraError(
            f"vLLM's serve check did not run in {python} (exit {proc.returncode}):\n{tail}"
        )
    return checks


def _quiet_env() -> dict[str, str]:
    # The program's own environment (a built server's is its own): no usage stats, no chatter.
    return {**os.environ, "VLLM_NO_USAGE_STATS": "1", "VLLM_LOGGING_LEVEL": "ERROR"}
