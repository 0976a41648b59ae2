"""The NIXL progress-thread delay reaches every agent config, whether NIXL is imported before or after."""

from __future__ import annotations

import sys
import types

import pytest

from pdcheck.errors import VllmIncompatible
from pdcheck.vllm_plugin.nixl_delay import install_nixl_delay

# A stand-in for a NIXL backend's `_api` module, shaped like nixl_cu12/_api.py: `nixl_agent`
# builds a `nixlBind.nixlAgentConfig`, hard-codes pthrDelay = 0 and calls `nixlBind.nixlAgent`.
_FAKE_BINDINGS = """
class nixlAgentConfig:
    pthrDelay = -1
built = []
def nixlAgent(name, config):
    built.append((name, config.pthrDelay))
    return name
"""
_FAKE_API = """
from . import _bindings as nixlBind
def nixl_agent(name):
    config = nixlBind.nixlAgentConfig()
    config.pthrDelay = 0
    return nixlBind.nixlAgent(name, config)
"""


@pytest.fixture
def isolated_imports(monkeypatch, tmp_path):
    """A private sys.meta_path and a fake `nixl_rocm` package (not installed here) on sys.path."""
    monkeypatch.setattr(sys, "meta_path", list(sys.meta_path))
    pkg = tmp_path / "nixl_rocm"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "_bindings.py").write_text(_FAKE_BINDINGS)
    (pkg / "_api.py").write_text(_FAKE_API)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield
    for name in [m for m in sys.modules if m.startswith("nixl_rocm")]:
        del sys.modules[name]


def test_agents_built_after_install_get_the_delay(isolated_imports):
    """Installed before NIXL is imported (the normal case in register()): the patch applies on import."""
    install_nixl_delay(1000, describe_version=lambda: "test")
    import nixl_rocm._api as api

    api.nixl_agent("a")
    api.nixl_agent("b")
    assert sys.modules["nixl_rocm._bindings"].built == [("a", 1000), ("b", 1000)]


def test_already_imported_nixl_is_patched_at_once_and_only_once(isolated_imports):
    """NIXL imported first (e.g. in-process tests): patched immediately; a second install does not double-wrap."""
    import nixl_rocm._api as api

    install_nixl_delay(250, describe_version=lambda: "test")
    install_nixl_delay(250, describe_version=lambda: "test")
    api.nixl_agent("a")
    assert sys.modules["nixl_rocm._bindings"].built == [("a", 250)]
    assert sum(type(f).__name__ == "_PatchOnImport" for f in sys.meta_path) == 1


def test_a_nixl_without_the_names_fails_loudly(isolated_imports, monkeypatch):
    """A NIXL whose _api lacks nixlBind.nixlAgent raises VllmIncompatible naming it, not a silent no-op."""
    api = types.ModuleType("nixl_cu12._api")
    api.nixlBind = types.SimpleNamespace(nixlAgentConfig=type("C", (), {"pthrDelay": 0}))
    monkeypatch.setitem(sys.modules, "nixl_cu12._api", api)
    with pytest.raises(VllmIncompatible, match=r"0\.32\.0 with nixl 9 .*nixlBind\.nixlAgent"):
        install_nixl_delay(1000, describe_version=lambda: "0.32.0 with nixl 9")
