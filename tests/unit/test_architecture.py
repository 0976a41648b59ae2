"""The layering holds: the orchestrating core imports without vLLM, and the public surface is pinned."""

from __future__ import annotations

import inspect
import pkgutil
import subprocess
import sys

import pdcheck

CORE_PACKAGES = ("config", "serving", "evals", "analysis", "sweep", "report", "cli")


def _core_modules() -> list[str]:
    names = ["pdcheck", "pdcheck.errors"]
    for pkg in CORE_PACKAGES:
        mod = __import__(f"pdcheck.{pkg}", fromlist=["_"])
        names.append(mod.__name__)
        for info in pkgutil.walk_packages(mod.__path__, prefix=f"pdcheck.{pkg}."):
            names.append(info.name)
    return names


def test_core_imports_without_vllm():
    """Importing any core module must not import vLLM (6-16 s, and often another venv)."""
    code = (
        "import importlib, sys\n"
        f"for name in {_core_modules()!r}:\n"
        "    importlib.import_module(name)\n"
        "bad = sorted(m for m in sys.modules if m == 'vllm' or m.startswith('vllm.') or m == 'torch')\n"
        "print(','.join(bad))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "", f"core modules imported: {out.stdout.strip()}"


def test_top_level_all_is_exactly_the_public_names():
    # Submodules become attributes when imported; they are not API names.
    public = {
        n
        for n in dir(pdcheck)
        if not n.startswith(("_", "@")) and not inspect.ismodule(getattr(pdcheck, n))
    }
    assert set(pdcheck.__all__) == public | {"__version__"}
