"""A vLLM platform plugin for the contract tier: vLLM's own CUDA platform on a machine with no GPU.

Loaded only from the contract tier's PYTHONPATH (its dist-info registers it under
`vllm.platform_plugins`); vLLM picks an activated out-of-tree platform over its built-in ones.
The class is the CUDA build's `NonNvmlCudaPlatform` with the GPU queries answered for eight
simulated GPUs: A100 80GB (compute capability 8.0), or H100 80GB (9.0) when
`PDCHECK_CONTRACT_SM=9.0`. Everything vLLM decides from the platform (executor, worker class,
model runner, async scheduling, attention backend, Mamba layout, KV connector) is computed by
that build's code.

Three things a GPU box has and this machine lacks are stood in for, and nothing else:
- the build's compiled extensions (`vllm._C_stable_libtorch`, `_vllm_fa2_C`, ...) need libcuda
  and a CUDA torch: a placeholder module stands in for each one that fails to load, so the
  pure-Python modules importing them load (any kernel call would fail; no check makes one).
  `PLACEHOLDERS` lists what was replaced and why;
- the four CUTLASS capability queries of `vllm._custom_ops` (`cutlass_*support*`), which the
  quantization utils call at import time (so NIXL's connector module could not import) and which
  would call into the placeholder: they answer from the simulated capability, as the kernels'
  own tables do (`STUBBED`);
- Triton's GPU driver: Triton is installed but finds no active driver here, so vLLM would set
  `HAS_TRITON` false and pick the V1 model runner, which no GPU box with Triton runs. It is set
  true, so the build picks the runner a GPU box picks.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import os
import sys
import types
from collections.abc import Callable

# The simulated GPU, by compute capability: name and memory are what vLLM may read.
_GPUS = {
    (8, 0): "NVIDIA A100-SXM4-80GB",
    (9, 0): "NVIDIA H100 80GB HBM3",
}
SM_ENV = "PDCHECK_CONTRACT_SM"
GPU_CAPABILITY: tuple[int, int] = tuple(  # type: ignore[assignment]
    int(p) for p in os.environ.get(SM_ENV, "8.0").split(".")
)
if GPU_CAPABILITY not in _GPUS:
    raise ValueError(f"{SM_ENV}={os.environ[SM_ENV]}: the contract platform simulates 8.0 or 9.0")
GPU_NAME = _GPUS[GPU_CAPABILITY]
GPU_MEMORY_BYTES = 80 * 2**30
GPU_COUNT = 8
PLACEHOLDERS: dict[str, str] = {}  # extension module -> why its real build did not load
STUBBED: list[str] = []  # Python-level names this plugin answers instead of the build


def _cutlass_answers(capability: int) -> dict[str, bool]:
    """What the CUDA build's CUTLASS kernels report for a capability (csrc/quantization/w8a8/cutlass)."""
    return {
        "cutlass_scaled_mm_supports_fp8": capability >= 89,
        "cutlass_scaled_mm_supports_block_fp8": 90 <= capability < 120,
        "cutlass_scaled_mm_supports_fp4": 100 <= capability < 130,
        "cutlass_group_gemm_supported": 90 <= capability < 110,
    }


def _stub_cutlass_queries(module: types.ModuleType) -> None:
    for name in sorted(n for n in vars(module) if n.startswith("cutlass_") and "support" in n):

        def query(cuda_device_capability: int, _name: str = name) -> bool:
            return _cutlass_answers(cuda_device_capability).get(_name, False)

        query.__name__ = name
        setattr(module, name, query)
        STUBBED.append(f"vllm._custom_ops.{name}")


def _triton_present(module: types.ModuleType) -> None:
    if not module.HAS_TRITON:
        module.HAS_TRITON = True
        STUBBED.append("vllm.triton_utils.importing.HAS_TRITON")


# Pure-Python modules of the build that get one fix-up after they ran.
_AFTER_EXEC: dict[str, Callable[[types.ModuleType], None]] = {
    "vllm._custom_ops": _stub_cutlass_queries,
    "vllm.triton_utils.importing": _triton_present,
}


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


class _FixUpLoader(importlib.abc.Loader):
    def __init__(self, real: importlib.abc.Loader) -> None:
        self._real = real

    def create_module(self, spec):
        return self._real.create_module(spec)

    def exec_module(self, module) -> None:
        self._real.exec_module(module)
        _AFTER_EXEC[module.__name__](module)


class _VllmFinder(importlib.abc.MetaPathFinder):
    """Finds vLLM's modules as usual; loads a placeholder for a compiled extension that cannot
    load, and fixes up the modules of `_AFTER_EXEC` once they ran."""

    def find_spec(self, name, path=None, target=None):
        if not name.startswith("vllm."):
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None:
            return None
        if isinstance(spec.loader, importlib.machinery.ExtensionFileLoader):
            spec.loader = _PlaceholderLoader(spec.loader)
        elif name in _AFTER_EXEC:
            spec.loader = _FixUpLoader(spec.loader)
        else:
            return None
        return spec


def install_finder() -> None:
    """Put the finder first; `sitecustomize` calls it at interpreter start, before any vLLM import."""
    if not any(isinstance(f, _VllmFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, _VllmFinder())


def activate() -> str:
    """The platform plugin: always active where this module is on the path."""
    install_finder()
    return "pdcheck_contract_platform_cuda.ContractCudaPlatform"
