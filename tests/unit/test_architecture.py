"""The layering holds: only the _vllm adapter imports vLLM, packages import only the layers below
them, names cross boundaries from one home, and the public surface is pinned. (That nothing
imports vLLM at import time is checked in a fresh interpreter: tests/slow/test_import_light.py.)"""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import pdcheck

PACKAGE_DIR = Path(pdcheck.__file__).parent


def _vllm_imports(path: Path) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module]
        else:
            continue
        found += [n for n in names if n == "vllm" or n.startswith("vllm.")]
    return found


def test_only_the_adapter_package_imports_vllm():
    """Every vLLM import, and so every vLLM-internal name, lives in pdcheck/_vllm/; race and
    vllm_plugin see only its records and callables."""
    outside = {
        str(path.relative_to(PACKAGE_DIR)): imports
        for path in sorted(PACKAGE_DIR.rglob("*.py"))
        if path.relative_to(PACKAGE_DIR).parts[0] != "_vllm" and (imports := _vllm_imports(path))
    }
    assert outside == {}
    # The scan must see the adapter's imports, or it proves nothing.
    assert _vllm_imports(PACKAGE_DIR / "_vllm" / "sim_scheduler.py")


def test_top_level_all_is_exactly_the_public_names():
    # Submodules become attributes when imported; they are not API names.
    public = {
        n
        for n in dir(pdcheck)
        if not n.startswith(("_", "@")) and not inspect.ismodule(getattr(pdcheck, n))
    }
    assert set(pdcheck.__all__) == public | {"__version__"}


# Which pdcheck packages each package may import (docs/architecture.md draws the same layers).
ALLOWED_IMPORTS: dict[str, set[str]] = {
    "errors": set(),
    "contracts": set(),
    "config": {"contracts", "errors"},
    "serving": {"config", "contracts", "errors"},
    "evals": {"config", "contracts", "errors"},
    "analysis": {"config", "contracts", "evals", "errors"},
    "results": {"analysis", "config", "contracts", "evals", "errors"},
    "report": {"analysis", "config", "contracts", "evals", "results", "errors"},
    "sweep": {"analysis", "config", "contracts", "evals", "serving", "results", "report", "errors"},
    "cli": {"*"},
    "__main__": {"cli"},
    "_vllm": {"contracts", "errors"},
    "vllm_plugin": {"_vllm", "contracts", "errors"},
    "race": {"_vllm", "vllm_plugin", "contracts", "errors"},
    "bisect": {"contracts", "errors"},
    "fixtures": {"config", "evals", "serving", "errors"},
    "pytest_plugin": {"analysis", "config", "results", "serving", "sweep", "errors"},
}
# Imports against the layers still to be removed; the set must stay exact.
KNOWN_DEBTS: set[tuple[str, str]] = set()


def _package_imports() -> set[tuple[str, str]]:
    """(importer, imported) for every import between two top-level parts of pdcheck."""
    found = set()
    for path in PACKAGE_DIR.rglob("*.py"):
        rel = path.relative_to(PACKAGE_DIR)
        source = rel.parts[0] if len(rel.parts) > 1 else rel.stem
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            elif isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            else:
                continue
            for name in names:
                parts = name.split(".")
                if parts[0] == "pdcheck" and len(parts) > 1 and parts[1] != source:
                    found.add((source, parts[1]))
    return found


def test_packages_import_only_the_layers_below_them():
    """Every import between pdcheck's packages follows docs/architecture.md's table, but the
    debts named there; and the debts list is exact, so paying one off updates it."""
    imports = _package_imports()
    against = {
        (src, dst)
        for src, dst in imports
        if "*" not in ALLOWED_IMPORTS.get(src, set()) and dst not in ALLOWED_IMPORTS.get(src, set())
    }
    assert against == KNOWN_DEBTS


def test_architecture_doc_names_only_packages_that_exist():
    """Each package the table of docs/architecture.md names is a package or module of pdcheck,
    and the test's layers cover exactly the packages there are."""
    import re

    doc = (PACKAGE_DIR.parent / "docs" / "architecture.md").read_text()
    named = set(re.findall(r"^\| `([a-z_]+)` \|", doc, flags=re.MULTILINE))
    existing = {
        p.name if p.is_dir() else p.stem
        for p in PACKAGE_DIR.iterdir()
        if (p.is_dir() and (p / "__init__.py").exists())
        or (p.suffix == ".py" and p.stem != "__init__")
    }
    assert named and named <= existing, named - existing
    assert set(ALLOWED_IMPORTS) - {"__main__"} == named


def test_pdcheck_variables_are_spelled_only_in_contracts():
    """A `PDCHECK_` environment variable's name is a string literal only in
    pdcheck/contracts/: every reader and writer imports it, so the two sides cannot drift."""
    spelled = []
    for path in sorted(PACKAGE_DIR.rglob("*.py")):
        rel = path.relative_to(PACKAGE_DIR)
        if rel.parts[0] == "contracts":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and str(node.value).startswith("PDCHECK_"):
                spelled.append(f"{rel}:{node.lineno} {node.value}")
    assert spelled == []


# Where a vLLM module's name may be spelled: the packages that run in or import vLLM, and the
# one contracts module that names vLLM for pdcheck's other processes.
VLLM_NAME_HOMES = ("_vllm", "vllm_plugin", "race")
VLLM_NAME_MODULES = {"contracts/vllm_names.py"}


def _vllm_names_spelled(path: Path) -> list[str]:
    return [
        f"{node.lineno} {node.value}"
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and node.value.startswith("vllm.")
    ]


def test_vllm_names_are_spelled_only_in_their_homes():
    """A string that starts `vllm.` (a vLLM module or attribute path) appears only in _vllm,
    vllm_plugin, race and contracts/vllm_names.py: vLLM's internals do not leak into the layers
    that never import vLLM as strings the import checks cannot see."""
    spelled = []
    for path in sorted(PACKAGE_DIR.rglob("*.py")):
        rel = path.relative_to(PACKAGE_DIR)
        if rel.parts[0] in VLLM_NAME_HOMES or rel.as_posix() in VLLM_NAME_MODULES:
            continue
        spelled += [f"{rel}:{hit}" for hit in _vllm_names_spelled(path)]
    assert spelled == []
    # The scan must see the homes' names, or it proves nothing.
    assert _vllm_names_spelled(PACKAGE_DIR / "_vllm" / "forkserver.py")
    assert _vllm_names_spelled(PACKAGE_DIR / "contracts" / "vllm_names.py")
