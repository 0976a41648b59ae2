"""action.yml's shell scripts pass shellcheck.

`make check` runs actionlint, which shellchecks every `run:` of the workflows but reads the
composite action.yml only for its inputs and contexts, never its scripts. So this test hands
each of them to the shellcheck that `make check` uses (the dev extra's, beside this python).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
SHELLCHECK = Path(sys.executable).parent / "shellcheck"

_ACTION = yaml.safe_load((ROOT / "action.yml").read_text())
_SCRIPTS = {step["name"]: step for step in _ACTION["runs"]["steps"] if "run" in step}


@pytest.mark.parametrize("name", sorted(_SCRIPTS))
def test_action_script_passes_shellcheck(name):
    """Each `run:` script of the composite action is bash that shellcheck finds nothing in."""
    step = _SCRIPTS[name]
    assert step["shell"] == "bash", (
        f"{name}: shellcheck is run as bash, the step says {step['shell']}"
    )
    proc = subprocess.run(
        [str(SHELLCHECK), "--shell=bash", "-"],
        input=step["run"],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, f"{name}:\n{proc.stdout}{proc.stderr}"
