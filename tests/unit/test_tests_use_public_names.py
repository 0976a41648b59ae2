"""Unit tests import pdcheck's public names only: a test pinned to a private helper breaks when
the helper is renamed and tests what a caller cannot reach (tests/README.md; issue 40)."""

from __future__ import annotations

import ast
from pathlib import Path

UNIT = Path(__file__).resolve().parent


def test_no_unit_test_imports_a_private_name_of_pdcheck():
    found = []
    for path in sorted(UNIT.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("pdcheck"):
                found += [
                    f"{path.relative_to(UNIT)}:{node.lineno}: {node.module}.{alias.name}"
                    for alias in node.names
                    if alias.name.startswith("_") and not alias.name.startswith("__")
                ]
    assert not found, "unit tests import private names; use or add a public one:\n" + "\n".join(
        found
    )
