"""Reading sweep files: a malformed file is refused with its path (and line), never a traceback.

Property-based: the shipped sweeps are cut short, garbled with random bytes (invalid UTF-8
included), or given values of the wrong type, missing and extra keys, and fed to `load_sweep`
and `pdcheck validate`.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml
from hypothesis import event, given
from hypothesis import strategies as st

from pdcheck.config import expand_cells, load_sweep
from pdcheck.config.load import SWEEPS_DIR
from pdcheck.errors import ExitCode, SweepFileError
from tests.unit.bad_files import BAD_FILES, fresh_dir, garbled, run_cli, truncated, wrong_typed

SHIPPED = {p.name: p.read_bytes() for p in sorted(SWEEPS_DIR.glob("*.yaml"))}


@st.composite
def broken_sweeps(draw: st.DrawFn) -> bytes:
    data = SHIPPED[draw(st.sampled_from(sorted(SHIPPED)))]
    return draw(
        truncated(data)
        | garbled(data)
        | wrong_typed(yaml.safe_load(data)).map(
            lambda doc: yaml.safe_dump(doc, allow_unicode=True).encode()
        )
    )


def _write(root: Path, data: bytes) -> Path:
    path = fresh_dir(root) / "sweep.yaml"
    path.write_bytes(data)
    return path


@BAD_FILES
@given(data=broken_sweeps())
def test_a_broken_sweep_file_loads_or_is_refused_naming_the_file(tmp_path, data):
    """`load_sweep` returns a spec whose cells expand, or raises SweepFileError (exit 3) whose
    message starts with the file (and its line when known); nothing else escapes."""
    path = _write(tmp_path, data)
    try:
        cells = expand_cells(load_sweep(path))
    except SweepFileError as exc:
        event("refused")
        assert exc.exit_code == ExitCode.CONFIG
        assert str(exc).startswith(str(path)) or str(exc).startswith(
            f"{len(exc.problems)} problems in {path}:"
        )  # type: ignore[attr-defined]
    else:
        event(f"{len(cells)} cells")


@BAD_FILES
@given(data=broken_sweeps())
def test_validate_exits_0_or_3_naming_the_file(tmp_path, data):
    """`pdcheck validate FILE` on any of these: exit 0, or 3 naming the file; no traceback."""
    path = _write(tmp_path, data)
    code, output = run_cli("validate", str(path))
    assert "Traceback" not in output
    assert code in (ExitCode.OK, ExitCode.CONFIG), output
    if code == ExitCode.CONFIG:
        assert str(path) in output, output


_MODELS = b"name: x\nmodels:\n  - {name: m1, path: /nonexistent}\n"


@pytest.mark.parametrize(
    ("data", "where"),
    [
        (b"name: x\nmodels: [\xff]\n", ":2: not UTF-8 text"),
        (b"name: x\nmodels: [a\n", ":3: YAML syntax error"),
        (b"- just\n- a list\n", ":1: a sweep file must be a mapping"),
        (
            _MODELS + b"exclude:\n  - {modle: m1}\n",
            ":5: exclude.0.modle: unknown selector key 'modle'; did you mean 'model'?",
        ),
        (
            _MODELS + b"include:\n  - {model: m2}\n",
            ":5: include.0.model: 'm2' matches no cell of the sweep",
        ),
        (_MODELS + b"exclude:\n  - {model: m1}\n", ": the sweep expands to no cells"),
    ],
)
def test_undecodable_unparsable_or_unexpandable_sweep_files_name_file_and_line(
    tmp_path, data, where
):
    """Bytes that are not UTF-8 name the line of the first bad byte, YAML errors and selectors
    that match nothing their line; rules that leave no cells name the file."""
    path = tmp_path / "s.yaml"
    path.write_bytes(data)
    code, output = run_cli("validate", str(path))
    assert code == ExitCode.CONFIG and re.search(re.escape(f"{path}") + re.escape(where), output), (
        output
    )
    assert "Traceback" not in output


def test_an_unknown_top_level_key_with_a_bracket_is_named(tmp_path):
    """A garbled first line that YAML reads as a key holding '[' (found by hypothesis) is refused
    as an unknown key named in the message, not an IndexError."""
    data = b"([# a comment cut short: x\n" + SHIPPED["cpu-smoke.yaml"]
    with pytest.raises(SweepFileError, match=r"\(\[# a comment cut short.*unknown key"):
        load_sweep(_write(tmp_path, data))
