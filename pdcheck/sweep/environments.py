"""The sweep's vLLM environments: the main one (pdcheck's own python) and each `environments:`
entry its selected cells name, made ready before anything starts and recorded in run.json.

Ready means: a pip requirement's venv is built (`pdcheck.serving.venvs`; pip failing is exit 3
naming it), every given python or `vllm` executable is there, and every model folder the cells
load exists (exit 3 naming model and path). All are checked before the run folder or any server exists.
"""

from __future__ import annotations

import shutil
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from pdcheck.config import Cell
from pdcheck.config.paths import check_model_paths, environment_python
from pdcheck.config.schema import EnvironmentSpec
from pdcheck.errors import ConfigError


@dataclass(frozen=True)
class SweepEnvironment:
    """One vLLM the sweep runs: its name (None for the main one), how it was given, its python."""

    name: str | None
    python: str
    given: str  # "pdcheck's python", "python: ...", "vllm: ..." (an executable or a requirement)

    @property
    def label(self) -> str:
        return self.name or "main"


def cell_environments(cells: Sequence[Cell]) -> list[EnvironmentSpec]:
    """The `environments:` entries the cells' arms name, once each, in order of appearance."""
    seen: dict[str, EnvironmentSpec] = {}
    for cell in cells:
        if cell.environment is not None:
            seen.setdefault(cell.environment.name, cell.environment)
    return list(seen.values())


def sweep_environments(cells: Sequence[Cell]) -> list[SweepEnvironment]:
    """The main environment, then each one the cells name that has a python to run the race
    harness in (an environment given only as a `vllm` executable has none)."""
    out = [SweepEnvironment(None, sys.executable, "pdcheck's python")]
    for env in cell_environments(cells):
        python = environment_python(env)
        if python is not None:
            given = f"python: {env.python}" if env.python else f"vllm: {env.vllm}"
            out.append(SweepEnvironment(env.name, python, given))
    return out


def prepare_environments(cells: Sequence[Cell]) -> None:
    """Refuse missing model folders, then build the venvs the cells need (exit 3 on either)."""
    check_model_paths({cell.model.name: cell.model for cell in cells}.values())
    from pdcheck.serving.venvs import ensure_environment

    for env in cell_environments(cells):
        _check_given_program(env)
        ensure_environment(env)


def _check_given_program(env: EnvironmentSpec) -> None:
    """A `python:` or `vllm:` executable that is not there would end as a server that never
    started; say so now, naming the environment."""
    given = env.python if env.python is not None else env.executable
    if given is None or shutil.which(given) is not None:
        return
    key = "python" if env.python is not None else "vllm"
    raise ConfigError(
        f"environment {env.name!r}: its {key} {given!r} is not an executable file; give the "
        "path of that installation's one (or a pip requirement as `vllm:`)"
    )


def environment_records(cells: Sequence[Cell]) -> list[dict[str, Any]]:
    """run.json's `environments`: each named environment's vLLM, commit and fixes, probed in its
    own python (the main one is run.json's `vllm`)."""
    from pdcheck.serving.environment import probe_vllm

    records = []
    for env in sweep_environments(cells)[1:]:
        records.append(
            {
                "name": env.name,
                "given": env.given,
                "vllm": probe_vllm(env.python, fixes=True).to_dict(),
            }
        )
    return records
