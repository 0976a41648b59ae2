"""The GPU inventory: from nvidia-smi, narrowed by CUDA_VISIBLE_DEVICES, or empty on CPU."""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass


@dataclass(frozen=True)
class Gpu:
    index: int
    name: str
    memory_total_mib: int | None = None


@dataclass(frozen=True)
class GpuInventory:
    gpus: tuple[Gpu, ...]
    source: str  # "nvidia-smi", "CUDA_VISIBLE_DEVICES", or "none"

    @property
    def count(self) -> int:
        return len(self.gpus)

    @property
    def indices(self) -> tuple[int, ...]:
        return tuple(g.index for g in self.gpus)


def parse_nvidia_smi_csv(text: str) -> tuple[Gpu, ...]:
    """Parse `nvidia-smi --query-gpu=index,name,memory.total --format=csv,noheader,nounits`."""
    gpus = []
    for line in text.strip().splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) < 2 or not parts[0].isdigit():
            continue
        mem = int(parts[2]) if len(parts) > 2 and parts[2].isdigit() else None
        gpus.append(Gpu(int(parts[0]), parts[1], mem))
    return tuple(gpus)


def _visible(env: dict[str, str]) -> list[int] | None:
    raw = env.get("CUDA_VISIBLE_DEVICES")
    if raw is None:
        return None
    return [int(x) for x in raw.split(",") if x.strip().isdigit()]


def read_inventory(*, env: dict[str, str] | None = None, nvidia_smi: str | None = None) -> GpuInventory:
    """The GPUs this process may use. `nvidia_smi` names the executable (tests pass a fake)."""
    env = dict(os.environ) if env is None else env
    exe = nvidia_smi or shutil.which("nvidia-smi")
    visible = _visible(env)
    if exe:
        try:
            proc = subprocess.run(
                [exe, "--query-gpu=index,name,memory.total", "--format=csv,noheader,nounits"],
                capture_output=True, text=True, timeout=20,
            )
        except (OSError, subprocess.TimeoutExpired):
            proc = None
        if proc is not None and proc.returncode == 0:
            gpus = parse_nvidia_smi_csv(proc.stdout)
            if visible is not None:
                gpus = tuple(g for g in gpus if g.index in visible)
            return GpuInventory(gpus, "nvidia-smi")
    if visible:
        return GpuInventory(tuple(Gpu(i, "unknown") for i in visible), "CUDA_VISIBLE_DEVICES")
    return GpuInventory((), "none")
