"""Which devices each server gets: GPU sets (disjoint, or shared with a memory share each), or CPU
cores to bind to.

Co-location: when a topology needs more GPUs than there are (P, D and the baseline on one GPU),
pdcheck puts several servers on one GPU, each with an explicit share of its memory, and starts
them one after another. Both follow from how vLLM sizes its memory on CUDA (0.32 and 0.33,
`v1/worker/utils.py` `request_memory`, `utils/mem_utils.py` `memory_profiling`):

- `--gpu-memory-utilization` is the fraction of the GPU's *total* memory a server may use, and
  a server refuses to start unless that much is *free* when it starts. Its default (0.92) leaves
  no room for a second server, so co-located servers split `COLOCATED_MEMORY_BUDGET`.
  `--kv-cache-memory-bytes` skips the KV sizing but not that start check, so the share is still
  needed with it.
- The KV cache gets the share minus what the server consumed, measured as the drop in the
  device's free memory from the server's start to the end of its profiling run: memory another
  process takes meanwhile is counted as this server's (a smaller KV cache, or none), and memory
  another releases fails vLLM's profiling assertion. So a server starts only once the servers
  before it on its GPUs are ready (`start_stage`).

Duplicated ids in CUDA_VISIBLE_DEVICES are refused (`gpus.py`): co-location is planned here from
the GPU count, never asked for by naming a GPU twice.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from pdcheck.errors import GpuInventoryError
from pdcheck.serving.gpus import GpuInventory

# What co-located servers split between them. A lone server keeps vLLM's default (0.92); each
# co-located one also holds a CUDA context (about 0.5 GiB) outside its share, and the next one's
# start check must still find its share free.
COLOCATED_MEMORY_BUDGET = 0.9


@dataclass(frozen=True)
class GpuShare:
    """One server's GPUs and, when it shares them, its memory share and start stage."""

    devices: tuple[str, ...]  # as CUDA_VISIBLE_DEVICES names them
    # `--gpu-memory-utilization`; None: the GPUs are the server's own (vLLM's default applies).
    memory_share: float | None = None
    # Servers start in stages: one of stage k starts once every server of stages < k is ready.
    start_stage: int = 0


def assign_gpus(needs: Sequence[tuple[str, int]], inventory: GpuInventory) -> list[GpuShare]:
    """The GPUs of each (server name, GPU count), in order.

    When they fit, one disjoint, contiguous run of the inventory's devices per server. When they
    do not, servers share GPUs: each takes the least loaded GPUs (one per TP rank), gets an even
    split of `COLOCATED_MEMORY_BUDGET` by the most servers on any of its GPUs, and starts after
    the servers placed on its GPUs before it.

    Refuses (before anything starts) a server whose TP is larger than the inventory: its ranks
    need a GPU each.
    """
    total = sum(n for _, n in needs)
    devices = [g.device for g in inventory.gpus]
    if total <= inventory.count:
        shares: list[GpuShare] = []
        start = 0
        for _, n in needs:
            shares.append(GpuShare(tuple(devices[start : start + n])))
            start += n
        return shares
    widest = [f"{name} {n}" for name, n in needs if n > inventory.count]
    if widest:
        detail = ", ".join(f"{name} {n}" for name, n in needs)
        raise GpuInventoryError(
            f"this topology needs {total} GPUs ({detail}) but the inventory ({inventory.source}) has "
            f"{inventory.count}; servers can share a GPU, but each TP rank needs a GPU of its own "
            f"({', '.join(widest)}): use smaller TP, or run on a larger machine"
        )
    placed: list[list[int]] = [[] for _ in devices]  # per GPU: the servers on it, in start order
    positions: list[tuple[int, ...]] = []
    for server, (_, n) in enumerate(needs):
        least_loaded = sorted(range(len(devices)), key=lambda g: (len(placed[g]), g))[:n]
        positions.append(tuple(sorted(least_loaded)))
        for g in least_loaded:
            placed[g].append(server)
    result = []
    for server, gpus in enumerate(positions):
        sharing = max(len(placed[g]) for g in gpus)
        result.append(
            GpuShare(
                tuple(devices[g] for g in gpus),
                memory_share=None if sharing == 1 else _even_share(sharing),
                start_stage=max(placed[g].index(server) for g in gpus),
            )
        )
    return result


def _even_share(servers: int) -> float:
    """Each of `servers` co-located servers' share, rounded down to a thousandth."""
    return math.floor(COLOCATED_MEMORY_BUDGET / servers * 1000) / 1000


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
