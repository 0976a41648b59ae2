"""Selectors that match nothing: a typo in an include/exclude key or value is refused at load
(exit 3, file:line, "did you mean"), never a sweep that silently runs other cells."""

from __future__ import annotations

from pathlib import Path

import pytest

from pdcheck.config import expand_cells, load_sweep
from pdcheck.errors import ExitCode, SweepFileError

BASE = """\
name: t
models:
  - {name: tiny-llama, path: /m/llama}
  - {name: tiny-granite, path: /m/granite, kind: hybrid}
matrix:
  decode_tp: [1, 2]
  arms: [fixes-on, inject-stale]
"""


def _load(tmp_path: Path, tail: str) -> SweepFileError:
    path = tmp_path / "s.yaml"
    path.write_text(BASE + tail)
    with pytest.raises(SweepFileError) as info:
        load_sweep(path)
    assert info.value.exit_code == ExitCode.CONFIG
    return info.value


@pytest.mark.parametrize(
    ("tail", "where", "suggestion"),
    [
        ("exclude:\n  - {model: tiny-lama}\n", ":9: exclude.0.model: 'tiny-lama'", "'tiny-llama'"),
        (
            "exclude:\n  - {arm: inject-stael}\n",
            ":9: exclude.0.arm: 'inject-stael'",
            "'inject-stale'",
        ),
        ("include:\n  - {kind: hybird}\n", ":9: include.0.kind: 'hybird'", "'hybrid'"),
        (
            "exclude:\n  - {modle: tiny-llama}\n",
            ":9: exclude.0.modle: unknown selector key",
            "'model'",
        ),
    ],
)
def test_a_selector_typo_is_refused_with_its_line_and_a_suggestion(
    tmp_path, tail, where, suggestion
):
    """A key or value no cell of the unfiltered product has names file:line and the closest
    spelling; the sweep would otherwise drop nothing (exclude) or keep nothing (include)."""
    err = _load(tmp_path, tail)
    assert where in str(err), str(err)
    assert f"did you mean {suggestion}?" in str(err), str(err)


def test_a_value_of_the_wrong_type_matches_nothing(tmp_path):
    """`decode_tp: true` equals 1 in Python, but no cell has a boolean TP: it is a typo."""
    err = _load(tmp_path, "exclude:\n  - {decode_tp: true}\n")
    assert "exclude.0.decode_tp: 'true' matches no cell" in str(err), str(err)


def test_values_each_taken_but_never_together_are_refused(tmp_path):
    """Each value exists, yet no cell has both: the selector still matches nothing."""
    err = _load(tmp_path, "exclude:\n  - {model: tiny-llama, kind: hybrid}\n")
    assert (
        ":9: exclude.0: no cell of the sweep has model: tiny-llama, kind: hybrid together"
        in str(err)
    )


def test_selectors_that_match_load_and_filter(tmp_path):
    """The check leaves good selectors alone: exclude drops the cells it names."""
    path = tmp_path / "s.yaml"
    path.write_text(BASE + "exclude:\n  - {model: tiny-llama, arm: inject-stale, decode_tp: 2}\n")
    assert len(expand_cells(load_sweep(path))) == 7


def test_an_async_value_a_cpu_sweep_collapses_is_not_a_typo(tmp_path):
    """On vllm-cpu every cell is sync, but a selector naming the matrix's `true` is the author's
    own axis value, so it loads."""
    path = tmp_path / "s.yaml"
    path.write_text(
        BASE
        + "  async_scheduling: [true, false]\nserving: {platform: cpu}\n"
        + "exclude:\n  - {async_scheduling: true}\n"
    )
    assert len(expand_cells(load_sweep(path))) == 8


def test_a_misspelt_builtin_arm_in_the_matrix_suggests_the_name(tmp_path):
    path = tmp_path / "s.yaml"
    path.write_text(BASE.replace("inject-stale]", "inject-stael]"))
    with pytest.raises(
        SweepFileError, match=r"unknown arm 'inject-stael'; did you mean 'inject-stale'\?"
    ):
        load_sweep(path)
