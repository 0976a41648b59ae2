"""Hypothesis strategies for malformed input files, and a CLI runner that returns pdcheck's exit code.

Each strategy starts from a valid file, so what it draws is near the real thing: cut short,
garbled with random bytes, or valid JSON/YAML of the wrong shape (a value of another type, a
missing key, an extra key, another type of document).
"""

from __future__ import annotations

import copy
import tempfile
from pathlib import Path
from typing import Any

from click.testing import CliRunner
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

from pdcheck.cli import main

# Modest counts: every reader gets these, and the unit tier must stay under a minute on 2 cores.
BAD_FILES = settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)

_JUNK = st.binary(min_size=1, max_size=12) | st.sampled_from(
    [b"\xff", b"\xc3", b"\x00", b"{", b'"', b"]", b"NaN", b"\n", b"\t-", b": ["]
)

# Any JSON value, kept small (YAML reads the same values).
json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3)
    ),
    max_leaves=6,
)


def truncated(data: bytes) -> st.SearchStrategy[bytes]:
    """`data` cut short at any byte."""
    return st.integers(0, max(len(data) - 1, 0)).map(lambda n: data[:n])


@st.composite
def garbled(draw: st.DrawFn, data: bytes) -> bytes:
    """`data` with a span of up to 20 bytes replaced by random bytes (often invalid UTF-8)."""
    start = draw(st.integers(0, len(data)))
    end = draw(st.integers(start, min(len(data), start + 20)))
    return data[:start] + draw(_JUNK) + data[end:]


def _paths(value: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [prefix]
    if isinstance(value, dict):
        for key, item in value.items():
            out += _paths(item, (*prefix, key))
    elif isinstance(value, list):
        for i, item in enumerate(value):
            out += _paths(item, (*prefix, i))
    return out


def _kind(value: Any) -> str:
    return (
        "number"
        if isinstance(value, int | float) and not isinstance(value, bool)
        else type(value).__name__
    )


@st.composite
def wrong_typed(draw: st.DrawFn, doc: Any) -> Any:
    """`doc` (parsed JSON or YAML) with one change somewhere: a value replaced by one of another
    type, a key removed, or an extra key added; at the top, maybe another type of document."""
    doc = copy.deepcopy(doc)
    path = draw(st.sampled_from(_paths(doc)))
    parent = doc
    for part in path[:-1]:
        parent = parent[part]
    target = parent[path[-1]] if path else doc
    action = draw(st.sampled_from(["replace", "delete", "extra"]))
    if action == "delete" and path and isinstance(parent, dict):
        del parent[path[-1]]
    elif action == "extra" and isinstance(target, dict):
        target[draw(st.text(min_size=1, max_size=6)) + "_extra"] = draw(json_values)
    else:
        new = draw(json_values.filter(lambda v: _kind(v) != _kind(target)))
        if not path:
            return new
        parent[path[-1]] = new
    return doc


def fresh_dir(root: Path) -> Path:
    """A new folder under `root` (a test's tmp_path) for one example: examples share the test's tmp_path."""
    return Path(tempfile.mkdtemp(dir=root))


def write_sweep(root: Path, data: bytes) -> Path:
    """`data` as sweep.yaml in a new folder under `root`."""
    path = fresh_dir(root) / "sweep.yaml"
    path.write_bytes(data)
    return path


def run_cli(*args: str) -> tuple[int, str]:
    """`pdcheck ARGS` through `pdcheck.cli.main`, as the console script runs it: (exit code, stdout + stderr).

    An exception that escapes `main` is a traceback the user would see, and fails the test.
    """
    runner = CliRunner()
    with runner.isolation() as (out, err, _):
        code = main(list(args))
    return code, out.getvalue().decode(errors="replace") + err.getvalue().decode(errors="replace")
