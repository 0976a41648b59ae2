"""Run one of pdcheck's `_vllm` programs (`python -m pdcheck._vllm.<name>`) in another python.

Serving never imports vLLM: what needs vLLM's own code runs in a subprocess of the python
that will run the servers, which may be another venv's interpreter. That python gets this
pdcheck on its path, and nothing else of this venv, so none of its own packages is shadowed.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path

_PDCHECK_PACKAGE = Path(__file__).resolve().parents[1]


def start_adapter_program(
    python: str, module: str, path_dir: str, *, env: Mapping[str, str] | None = None
) -> subprocess.Popen[str]:
    """`python -m module` with pdcheck reachable through `path_dir` (see `pdcheck_path`)."""
    base = dict(os.environ if env is None else env)
    base["PYTHONPATH"] = os.pathsep.join(p for p in (path_dir, base.get("PYTHONPATH")) if p)
    return subprocess.Popen(
        [python, "-m", module],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=base,
    )


def pdcheck_path() -> tempfile.TemporaryDirectory[str]:
    """A folder holding only a link to this pdcheck package, to put first on another python's path."""
    folder = tempfile.TemporaryDirectory(prefix="pdcheck-path-")
    (Path(folder.name) / "pdcheck").symlink_to(_PDCHECK_PACKAGE, target_is_directory=True)
    return folder


def program_sources_digest(modules: Sequence[str]) -> str:
    """A digest of the source files of pdcheck modules (`pdcheck._vllm.fixes`, ...): what a
    program's answer can change with, on pdcheck's side."""
    digest = hashlib.sha256()
    for module in modules:
        relative = Path(*module.split(".")[1:]).with_suffix(".py")
        digest.update((_PDCHECK_PACKAGE / relative).read_bytes())
    return digest.hexdigest()


def run_adapter_program(
    python: str,
    module: str,
    *,
    stdin: str = "",
    timeout_s: float,
    env: Mapping[str, str] | None = None,
) -> subprocess.CompletedProcess[str]:
    """`python -m module`, fed `stdin`, to completion; OSError or TimeoutExpired when it cannot run."""
    with pdcheck_path() as path_dir:
        proc = start_adapter_program(python, module, path_dir, env=env)
        return finish(proc, stdin=stdin, timeout_s=timeout_s)


def finish(
    proc: subprocess.Popen[str], *, stdin: str = "", timeout_s: float
) -> subprocess.CompletedProcess[str]:
    try:
        out, err = proc.communicate(stdin, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        raise
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
