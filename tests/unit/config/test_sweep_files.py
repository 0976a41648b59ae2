"""Sweep files: validation errors name file, line and key; expansion is stable."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from pdcheck.config import expand_cells, load_sweep, select_cells
from pdcheck.config.load import SWEEPS_DIR, resolve_sweep_path, shipped_sweep_names
from pdcheck.errors import ConfigError, SweepFileError, SweepFileErrors

BASE = """\
name: t
models:
  - name: m1
    path: /models/m1
  - name: m2
    path: /models/m2
    kind: hybrid
matrix:
  decode_tp: [1, 2]
  async_scheduling: [true, false]
  arms: [fixes-on, fixes-off]
  concurrency: [8, 1]
"""


def write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "s.yaml"
    p.write_text(textwrap.dedent(text))
    return p


def test_every_shipped_sweep_loads_and_expands():
    """Shipped sweeps are valid; a broken one must fail here, not on a GPU node."""
    files = sorted(SWEEPS_DIR.glob("*.yaml"))
    assert files, "no shipped sweeps found"
    for f in files:
        cells = expand_cells(load_sweep(f))
        assert cells, f


def test_expansion_is_the_product_and_ids_are_stable(tmp_path):
    """Cells are model × TP × async × arm; concurrency stays inside a cell, sorted."""
    cells = expand_cells(load_sweep(write(tmp_path, BASE)))
    assert len(cells) == 2 * 2 * 2 * 2
    assert all(c.concurrency == (1, 8) for c in cells)
    again = expand_cells(load_sweep(write(tmp_path, BASE)))
    assert [c.id for c in cells] == [c.id for c in again]
    assert len({c.id for c in cells}) == len(cells)
    assert cells[0].name == "m1-p1x1-d1x1-async-fixes-on"


def test_id_changes_with_any_resolved_setting(tmp_path):
    """The id is a hash of the resolved config: changing the eval limit changes every id."""
    a = expand_cells(load_sweep(write(tmp_path, BASE)))
    b = expand_cells(load_sweep(write(tmp_path, BASE + "eval: {limit: 10}\n")))
    assert not {c.id for c in a} & {c.id for c in b}


def test_include_exclude(tmp_path):
    """exclude drops matches; include keeps only matches."""
    text = (
        BASE + "exclude:\n  - {model: m2, async_scheduling: false}\ninclude:\n  - {decode_tp: 1}\n"
    )
    cells = expand_cells(load_sweep(write(tmp_path, text)))
    assert all(c.decode_tp == 1 for c in cells)
    assert not any(c.model.name == "m2" and not c.async_scheduling for c in cells)
    assert len(cells) == 8 - 2


def test_selection_by_name_id_and_keyword(tmp_path):
    cells = expand_cells(load_sweep(write(tmp_path, BASE)))
    assert select_cells(cells, only=(cells[3].id,)) == [cells[3]]
    assert select_cells(cells, only=(cells[2].name,)) == [cells[2]]
    sel = select_cells(cells, keyword="m2 and not fixes-off")
    assert sel and all("m2" in c.name and "fixes-off" not in c.name for c in sel)
    with pytest.raises(ConfigError, match="names no cell"):
        select_cells(cells, only=("nope",))


@pytest.mark.parametrize(
    ("patch", "line", "key", "fragment"),
    [
        ("matrix:\n  decode_tp: [0]\n", 9, "matrix.decode_tp.0", "positive integer"),
        ("matrix:\n  decode_tp: [-1]\n", 9, "matrix.decode_tp.0", "positive integer"),
        ("matrix:\n  decode_tp: []\n", 9, "matrix.decode_tp", "axis is empty"),
        ("matrix:\n  concurrenty: [1]\n", 9, "matrix.concurrenty", "unknown key"),
        ("matrix:\n  async_scheduling: [maybe]\n", 9, "matrix.async_scheduling.0", "bool"),
        ("matrix:\n  arms: [fixes-of]\n", 9, "matrix.arms.0", "built-in arms are fixes-on"),
    ],
)
def test_bad_values_name_file_line_key_and_what_is_allowed(tmp_path, patch, line, key, fragment):
    """Every error names file, line and dotted key path, and says what is allowed."""
    head = BASE.split("matrix:")[0]
    p = write(tmp_path, head + patch)
    with pytest.raises(SweepFileError) as info:
        load_sweep(p)
    err = info.value
    assert err.path == str(p)
    assert err.key == key
    assert err.line == line
    assert fragment in str(err)
    assert str(err).startswith(f"{p}:{line}: {key}: ")


def test_duplicate_model_is_rejected(tmp_path):
    text = "name: t\nmodels:\n  - {name: a, path: x}\n  - {name: a, path: y}\n"
    with pytest.raises(SweepFileError, match=r"duplicate model name.*a"):
        load_sweep(write(tmp_path, text))


def test_yaml_syntax_error_names_line(tmp_path):
    p = write(tmp_path, "name: t\nmodels:\n  - {name: a, path: x\n")
    with pytest.raises(SweepFileError, match="YAML syntax error") as info:
        load_sweep(p)
    assert info.value.line is not None


def test_unknown_selector_key(tmp_path):
    with pytest.raises(
        ConfigError, match=r"unknown selector key .modle.; did you mean .model.\? allowed: model"
    ):
        expand_cells(load_sweep(write(tmp_path, BASE + "exclude:\n  - {modle: m1}\n")))


def test_bad_injection_and_environment_reference(tmp_path):
    text = BASE.replace("arms: [fixes-on, fixes-off]", "arms: [{name: x, inject: 'melt:0.5'}]")
    with pytest.raises(SweepFileError, match="zero-loaded-kv, stale-kv"):
        load_sweep(write(tmp_path, text))
    text = BASE.replace("arms: [fixes-on, fixes-off]", "arms: [{name: x, environment: old}]")
    with pytest.raises(SweepFileError, match="environment 'old'"):
        load_sweep(write(tmp_path, text))


def test_missing_file_lists_shipped_sweeps():
    with pytest.raises(SweepFileError, match=r"shipped sweeps: .*cpu-smoke"):
        load_sweep("no-such-sweep")


def test_every_problem_is_named_with_its_line_key_and_a_did_you_mean(tmp_path):
    """A missing `name` does not hide the misspelt keys below it: each problem has its own line and key path."""
    text = BASE.replace("name: t\n", "").replace(
        "    kind: hybrid", "    kind: hybird\n    serve_arg: [--x]"
    )
    text = text.replace("  concurrency: [8, 1]", "  concurency: [8, 1]")
    with pytest.raises(SweepFileErrors) as caught:
        load_sweep(write(tmp_path, text))
    found = {(p.line, p.key): str(p) for p in caught.value.problems}
    assert set(found) == {
        (1, "name"),
        (6, "models.1.kind"),
        (7, "models.1.serve_arg"),
        (12, "matrix.concurency"),
    }
    assert "did you mean 'serve_args'?" in found[(7, "models.1.serve_arg")]
    assert "did you mean 'concurrency'?" in found[(12, "matrix.concurency")]
    assert "did you mean 'hybrid'?" in found[(6, "models.1.kind")]
    assert "4 problems" in str(caught.value) and all(
        message in str(caught.value) for message in found.values()
    )


def test_unknown_key_inside_a_list_of_unions_gets_a_suggestion(tmp_path):
    """An arm definition's misspelt key is found through the built-in-name-or-mapping union."""
    text = BASE.replace(
        "arms: [fixes-on, fixes-off]", "arms: [fixes-on, {name: x, injekt: 'zero-loaded-kv:0.5'}]"
    )
    with pytest.raises(
        SweepFileError, match=r"matrix\.arms\.1\.injekt: unknown key; did you mean 'inject'\?"
    ):
        load_sweep(write(tmp_path, text))


def test_bare_names_find_shipped_sweeps_and_paths_find_files(tmp_path, monkeypatch):
    """`pr` and `pr.yaml` name the shipped sweep from any folder; a path that does not exist is an error."""
    monkeypatch.chdir(tmp_path)
    assert resolve_sweep_path("pr") == SWEEPS_DIR / "pr.yaml" == resolve_sweep_path("pr.yaml")
    with pytest.raises(SweepFileError, match=r"shipped sweeps: .*pr"):
        resolve_sweep_path("sweeps/pr.yaml")
    mine = write(tmp_path, BASE)
    assert resolve_sweep_path(str(mine)) == mine


def test_shipped_sweeps_say_what_they_cost(monkeypatch):
    """`pdcheck sweep --list` shows each shipped sweep's description and expected GPU-hours."""
    from click.testing import CliRunner

    from pdcheck.cli import cli
    from pdcheck.cli._common import console

    monkeypatch.setattr(console, "width", 300)
    result = CliRunner().invoke(cli, ["sweep", "--list"])
    assert result.exit_code == 0, result.output
    for name in shipped_sweep_names():
        spec = load_sweep(name)
        assert spec.description and spec.expected_gpu_hours is not None, name
        assert name in result.output and spec.description in result.output
        assert f"│ {spec.expected_gpu_hours:g} " in result.output
    assert CliRunner().invoke(cli, ["validate", "--list"]).output == result.output
