"""A vLLM platform plugin for the contract tier: vLLM's own CUDA platform on a machine with no GPU.

Loaded only from the contract tier's PYTHONPATH (its dist-info registers it under
`vllm.platform_plugins`); vLLM picks an activated out-of-tree platform over its built-in ones.
The class is the CUDA build's `NonNvmlCudaPlatform` with the GPU queries answered for eight
simulated A100 80GB (SM 8.0): everything vLLM decides from the platform (executor, worker
class, async scheduling, attention backend, Mamba layout) is computed by that build's code.

The build's compiled extensions (`vllm._C_stable_libtorch`, `_vllm_fa2_C`, ...) need
libcuda and a CUDA torch, so they cannot load here. A placeholder module stands in for each
one that fails, so the pure-Python modules importing them load; any kernel call would still
fail, and none of the checks make one. `PLACEHOLDERS` lists what was replaced and why.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import types

# An A100 (SM 8.0): on SM 9.0 vLLM filters Triton kernel configs at import time
# (mamba ops' _drop_racy_wgmma_configs), and Triton has no GPU driver here, so vLLM runs
# with its Triton placeholder, whose configs cannot be filtered.
GPU_NAME = "NVIDIA A100-SXM4-80GB"
GPU_CAPABILITY = (8, 0)
GPU_MEMORY_BYTES = 80 * 2**30
GPU_COUNT = 8
PLACEHOLDERS: dict[str, str] = {}  # extension module -> why its real build did not load


class _PlaceholderLoader(importlib.abc.Loader):
    def __init__(self, real: importlib.abc.Loader) -> None:
        self._real = real

    def create_module(self, spec):
        try:
            return self._real.create_module(spec)
        except ImportError as exc:
            PLACEHOLDERS[spec.name] = str(exc)
            module = types.ModuleType(spec.name)
            module.__doc__ = f"pdcheck contract placeholder: {exc}"
            return module

    def exec_module(self, module) -> None:
        if module.__name__ not in PLACEHOLDERS:
            self._real.exec_module(module)


class _VllmExtensionFinder(importlib.abc.MetaPathFinder):
    """Finds vLLM's compiled extensions as usual, but loads a placeholder when the real one cannot load."""

    def find_spec(self, name, path=None, target=None):
        if not name.startswith("vllm."):
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or not isinstance(spec.loader, importlib.machinery.ExtensionFileLoader):
            return None
        spec.loader = _PlaceholderLoader(spec.loader)
        return spec


def activate() -> str:
    """The platform plugin: always active where this module is on the path."""
    if not any(isinstance(f, _VllmExtensionFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, _VllmExtensionFinder())
    return "pdcheck_contract_platform_cuda.ContractCudaPlatform"
