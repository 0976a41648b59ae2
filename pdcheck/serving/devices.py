"""Which devices each server gets: disjoint contiguous GPU sets, or CPU cores to bind to."""

from __future__ import annotations

from collections.abc import Sequence

from pdcheck.errors import GpuInventoryError
from pdcheck.serving.gpus import GpuInventory


def assign_gpus(needs: Sequence[tuple[str, int]], inventory: GpuInventory) -> list[tuple[str, ...]]:
    """One disjoint, contiguous run of the inventory's devices per (server name, GPU count), in order,
    each device named as CUDA_VISIBLE_DEVICES should name it.

    Refuses (before anything starts) a topology that needs more GPUs than there are, saying
    how many it needs, for which servers, and how many the inventory has.
    """
    total = sum(n for _, n in needs)
    if total > inventory.count:
        detail = ", ".join(f"{name} {n}" for name, n in needs)
        raise GpuInventoryError(
            f"this topology needs {total} GPUs ({detail}) but the inventory ({inventory.source}) has "
            f"{inventory.count}; use fewer instances or smaller TP, or run on a larger machine"
        )
    devices = [g.device for g in inventory.gpus]
    sets: list[tuple[str, ...]] = []
    start = 0
    for _, n in needs:
        sets.append(tuple(devices[start : start + n]))
        start += n
    return sets


def assign_cpu_binds(roles: Sequence[tuple[str, int]], *, cpu_count: int) -> list[str]:
    """A `VLLM_CPU_OMP_THREADS_BIND` value per (role, TP): decoders on the upper half of the cores.

    Prefill and baseline servers share the lower half, decoders the upper half (on 2 cores:
    `0` and `1`, the split measured to work). A TP>1 server splits its half into one range per
    rank, joined by `|` as vLLM expects; with too few cores ranks share one.
    """
    lower = list(range(max(1, cpu_count // 2)))
    upper = list(range(cpu_count // 2, cpu_count)) or lower
    binds = []
    for role, tp in roles:
        cores = upper if role == "decode" else lower
        binds.append("|".join(_core_range(part) for part in _split(cores, tp)))
    return binds


def _split(cores: list[int], parts: int) -> list[list[int]]:
    if parts > len(cores):
        return [cores] * parts
    size = len(cores) // parts
    return [cores[i * size : (i + 1) * size] for i in range(parts)]


def _core_range(cores: list[int]) -> str:
    return str(cores[0]) if len(cores) == 1 else f"{cores[0]}-{cores[-1]}"
