"""`PDCHECK_NIXL_PTHR_DELAY_US`: let NIXL's progress thread sleep instead of busy-polling.

NIXL's Python wrapper hard-codes `pthrDelay = 0`, so each agent's UCX progress thread spins a
whole core even when idle. On a 2-core CPU machine running a prefiller and a decoder that
starved the model (a 32-token request took 26-78 s and KV blocks expired); 1000 µs brought
idle CPU from ~142% to ~4% (/work/shared/notes/vllm-on-cpu.md). vLLM has no setting for it.

The delay must be set before the agent is built, in whichever vLLM process builds it (the
worker). Importing NIXL eagerly in every process would cost ~2 s each and would defeat vLLM's
own `UCX_RCACHE_MAX_UNRELEASED` default, which it can only set before NIXL is imported; so the
patch is applied when NIXL's `_api` module is first imported (or at once if it already is).
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import logging
import sys
from collections.abc import Callable
from types import ModuleType

from pdcheck._vllm.worker import NIXL_API_MODULES, missing_nixl_names, wrap_nixl_agent
from pdcheck.errors import VllmIncompatible

__all__ = ["install_nixl_delay"]

logger = logging.getLogger(__name__)


def install_nixl_delay(pthr_delay_us: int, *, describe_version: Callable[[], str]) -> None:
    """Arrange for every NIXL agent in this process to use `pthr_delay_us`. Idempotent.

    `describe_version()` names the installed vLLM/NIXL in the error raised when NIXL's internals differ.
    """

    def patch(module: ModuleType) -> None:
        missing = missing_nixl_names(module)
        if missing:
            raise VllmIncompatible(describe_version(), missing)
        wrap_nixl_agent(module, pthr_delay_us=pthr_delay_us)
        logger.info(
            "pdcheck: NIXL progress-thread delay set to %d us (%s)", pthr_delay_us, module.__name__
        )

    loaded = [sys.modules[n] for n in NIXL_API_MODULES if n in sys.modules]
    for module in loaded:
        patch(module)
    if not any(isinstance(f, _PatchOnImport) for f in sys.meta_path):
        sys.meta_path.insert(0, _PatchOnImport(frozenset(NIXL_API_MODULES), patch))


class _PatchOnImport(importlib.abc.MetaPathFinder):
    """Runs `patch(module)` right after one of `names` is executed by its real loader."""

    def __init__(self, names: frozenset[str], patch: Callable[[ModuleType], None]):
        self._names = names
        self._patch = patch

    def find_spec(self, fullname, path, target=None):
        if fullname not in self._names:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path, target)
        if spec is None or spec.loader is None:
            return None
        spec.loader = _PatchingLoader(spec.loader, self._patch)
        return spec


class _PatchingLoader(importlib.abc.Loader):
    def __init__(self, loader: importlib.abc.Loader, patch: Callable[[ModuleType], None]):
        self._loader = loader
        self._patch = patch

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module):
        self._loader.exec_module(module)
        self._patch(module)
