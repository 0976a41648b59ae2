"""Check a `vllm serve` argv with vLLM's own parser, in a subprocess of the python that will run it.

Parsing needs no GPU, so a GPU topology (TP 2, CUDA env) can be checked on a CPU box by
`--dry-run`. vLLM is never imported into pdcheck's process: the check runs in `python`,
which may be another venv's interpreter.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Sequence

from pdcheck.errors import InfraError

# Where `make_arg_parser` and `validate_parsed_serve_args` live, newest vLLM first:
# 0.33 moved them to entrypoints.common; 0.32 has them in entrypoints.launchers; older
# releases in entrypoints.openai.
SERVE_PARSER_MODULES = (
    "vllm.entrypoints.common.cli_args",
    "vllm.entrypoints.launchers.cli_args",
    "vllm.entrypoints.openai.cli_args",
)

# Runs in the target python.
_CHECK = r"""
import contextlib, importlib, io, json, sys
argvs, homes = json.loads(sys.argv[1]), json.loads(sys.argv[2])
try:
    from vllm.utils.argparse_utils import FlexibleArgumentParser
except ImportError:
    from vllm.utils import FlexibleArgumentParser
for home in homes:
    try:
        cli_args = importlib.import_module(home)
    except ModuleNotFoundError as exc:
        if not home.startswith(exc.name or "?"):
            raise
        continue
    if hasattr(cli_args, "make_arg_parser"):
        break
else:
    sys.exit("no vLLM module among %s has make_arg_parser" % ", ".join(homes))
make_arg_parser, validate_parsed_serve_args = cli_args.make_arg_parser, cli_args.validate_parsed_serve_args
results = []
for argv in argvs:
    problems = []
    parser = make_arg_parser(FlexibleArgumentParser(prog="vllm serve"))
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            args = parser.parse_args(argv)
    except SystemExit:
        lines = err.getvalue().strip().splitlines()
        problems.append(lines[-1] if lines else "vLLM's parser rejected the arguments")
    else:
        try:
            validate_parsed_serve_args(args)
        except Exception as exc:
            problems.append(f"{type(exc).__name__}: {exc}")
    results.append(problems)
print("PDCHECK-RESULT " + json.dumps(results))
"""


def serve_args_of(argv: Sequence[str]) -> list[str]:
    """The arguments after `serve` in a full server argv (launcher and subcommand dropped)."""
    argv = list(argv)
    if "serve" not in argv:
        raise ValueError(f"not a `vllm serve` command line: {argv[:4]}...")
    return argv[argv.index("serve") + 1 :]


def check_serve_argv(argv: Sequence[str], python: str, *, timeout_s: float = 180.0) -> list[str]:
    """Problems vLLM's own parser finds in a `vllm serve` argv ([] when it parses), run in `python`.

    Raises `InfraError` when `python` cannot run the check at all (no vLLM there, say).
    """
    return check_serve_argvs([argv], python, timeout_s=timeout_s)[0]


def check_serve_argvs(
    argvs: Sequence[Sequence[str]], python: str, *, timeout_s: float = 180.0
) -> list[list[str]]:
    """`check_serve_argv` for several command lines with one vLLM import (10-20 s each saved)."""
    args = [serve_args_of(argv) for argv in argvs]
    try:
        proc = subprocess.run(
            [python, "-c", _CHECK, json.dumps(args), json.dumps(SERVE_PARSER_MODULES)],
            capture_output=True,
            text=True,
            timeout=timeout_s,
            env=_quiet_env(),
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise InfraError(f"could not run vLLM's argument parser in {python}: {exc}") from exc
    for line in proc.stdout.splitlines():
        if line.startswith("PDCHECK-RESULT "):
            return [list(p) for p in json.loads(line.removeprefix("PDCHECK-RESULT "))]
    tail = "\n".join(proc.stderr.strip().splitlines()[-10:])
    raise InfraError(
        f"vLLM's argument parser did not run in {python} (exit {proc.returncode}):\n{tail}"
    )


def _quiet_env() -> dict[str, str]:
    # Parsing only: keep vLLM from probing a hub or logging usage stats.
    return {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "VLLM_NO_USAGE_STATS": "1",
        "VLLM_LOGGING_LEVEL": "ERROR",
    }
