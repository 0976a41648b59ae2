"""Reading sweep files, fuzzed: a malformed file is refused with its path (and line), never a
traceback. The shipped sweeps are cut short, garbled with random bytes (invalid UTF-8 included),
or given values of the wrong type, missing and extra keys, and fed to `load_sweep` and `pdcheck
validate` (80 files: seconds of CPU, so here; the named cases are in
tests/unit/config/test_sweep_file_reading.py).
"""

from __future__ import annotations

import yaml
from hypothesis import event, given
from hypothesis import strategies as st

from pdcheck.config import expand_cells, load_sweep
from pdcheck.config.load import SWEEPS_DIR
from pdcheck.errors import ExitCode, SweepFileError
from tests.unit.bad_files import BAD_FILES, garbled, run_cli, truncated, write_sweep, wrong_typed

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


@BAD_FILES
@given(data=broken_sweeps())
def test_a_broken_sweep_file_loads_or_is_refused_naming_the_file(tmp_path, data):
    """`load_sweep` returns a spec whose cells expand, or raises SweepFileError (exit 3) whose
    message starts with the file (and its line when known); nothing else escapes."""
    path = write_sweep(tmp_path, data)
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
    path = write_sweep(tmp_path, data)
    code, output = run_cli("validate", str(path))
    assert "Traceback" not in output
    assert code in (ExitCode.OK, ExitCode.CONFIG), output
    if code == ExitCode.CONFIG:
        assert str(path) in output, output
