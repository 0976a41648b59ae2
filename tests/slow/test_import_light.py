"""Importing pdcheck imports no vLLM: checked in a fresh interpreter, where nothing else has.

(Moved from tests/unit/test_architecture.py: it starts a process.)
"""

from __future__ import annotations

import pkgutil
import subprocess
import sys

CORE_PACKAGES = (
    "contracts",
    "config",
    "serving",
    "evals",
    "analysis",
    "results",
    "report",
    "sweep",
    "cli",
    "bisect",
    "pytest_plugin",
)
# The packages that may reach vLLM at run time: race and vllm_plugin, through the _vllm adapter.
VLLM_PACKAGES = ("_vllm", "race", "vllm_plugin")


def _modules(packages: tuple[str, ...]) -> list[str]:
    names = []
    for pkg in packages:
        mod = __import__(f"pdcheck.{pkg}", fromlist=["_"])
        names.append(mod.__name__)
        for info in pkgutil.walk_packages(mod.__path__, prefix=f"pdcheck.{pkg}."):
            names.append(info.name)
    return names


def test_no_module_imports_vllm_at_import_time():
    """Importing any core module must not import vLLM (6-16 s, and often another venv); the adapter,
    race and plugin modules import it inside the functions that use it, so `pdcheck race --help`
    stays fast and a missing or incompatible vLLM is reported by the start-up check."""
    modules = ["pdcheck", "pdcheck.errors", *_modules(CORE_PACKAGES + VLLM_PACKAGES)]
    code = (
        "import importlib, sys\n"
        f"for name in {modules!r}:\n"
        "    importlib.import_module(name)\n"
        "bad = sorted(m for m in sys.modules if m == 'vllm' or m.startswith('vllm.') or m == 'torch')\n"
        "print(','.join(bad))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "", f"importing pdcheck's modules imported: {out.stdout.strip()}"
