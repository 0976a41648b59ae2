"""Reading sweep files: a malformed file is refused with its path (and line), never a traceback.

Named cases, each with the line it must name; the shipped sweeps fuzzed (cut short, garbled,
wrong-typed) are in tests/slow/test_sweep_file_fuzz.py.
"""

from __future__ import annotations

import re

import pytest

from pdcheck.config import load_sweep
from pdcheck.config.load import SWEEPS_DIR
from pdcheck.errors import ExitCode, SweepFileError
from tests.unit.bad_files import run_cli, write_sweep

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
    data = b"([# a comment cut short: x\n" + (SWEEPS_DIR / "cpu-smoke.yaml").read_bytes()
    with pytest.raises(SweepFileError, match=r"\(\[# a comment cut short.*unknown key"):
        load_sweep(write_sweep(tmp_path, data))
