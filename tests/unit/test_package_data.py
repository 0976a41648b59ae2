"""The repo has one copy of the shipped sweeps and fixtures, and the wheel's package data covers all of it.

pdcheck/data/sweeps and pdcheck/data/fixtures (what importlib.resources reads, and what the
wheel carries) are links to the top-level folders. The install test (tests/install) checks the
built archives; this one fails fast, without building, when the two copies could drift or a new
kind of file would be left out of the wheel.
"""

from __future__ import annotations

import fnmatch
import tomllib
from pathlib import Path

import pytest

from pdcheck.config.paths import shipped_dir

ROOT = Path(__file__).resolve().parents[2]
FOLDERS = ("sweeps", "fixtures")


def _tree(folder: Path) -> dict[str, bytes]:
    return {
        p.relative_to(folder).as_posix(): p.read_bytes()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


@pytest.mark.parametrize("name", FOLDERS)
def test_the_package_reads_the_top_level_folder_itself(name):
    """pdcheck/data/<name> is a link to <name>/ (not a copy), and both show the same files and bytes."""
    link = ROOT / "pdcheck" / "data" / name
    assert link.is_symlink() and link.resolve() == (ROOT / name).resolve(), (
        f"{link} must link to {name}/"
    )
    assert shipped_dir(name).resolve() == (ROOT / name).resolve()
    assert _tree(shipped_dir(name)) == _tree(ROOT / name)


def test_package_data_globs_cover_every_shipped_file():
    """Each file under sweeps/ and fixtures/ matches a package-data pattern, so the wheel carries it."""
    patterns = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"][
        "package-data"
    ]["pdcheck"]
    shipped = [f"data/{name}/{path}" for name in FOLDERS for path in _tree(ROOT / name)]
    missed = [
        path
        for path in shipped
        if not any(
            fnmatch.fnmatchcase(path, p) and path.count("/") == p.count("/") for p in patterns
        )
    ]
    assert not missed, f"add a package-data pattern in pyproject.toml for {missed}"
