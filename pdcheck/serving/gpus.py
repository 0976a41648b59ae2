"""The GPU inventory: from nvidia-smi, narrowed by CUDA_VISIBLE_DEVICES, or empty on CPU.

CUDA_VISIBLE_DEVICES may name GPUs by index, by UUID (`GPU-…`) or name MIG instances
(`MIG-…`); every form is kept, and a server is handed each device by the name it was given.
Indices are nvidia-smi's, which are PCI bus order: servers get CUDA_DEVICE_ORDER=PCI_BUS_ID
so that CUDA counts the same way.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass, replace

from pdcheck.errors import ConfigError


@dataclass(frozen=True)
class Gpu:
    index: int  # nvidia-smi's index; a MIG instance (not in its list) comes after the GPUs
    name: str
    memory_total_mib: int | None = None
    uuid: str | None = None
    # How CUDA_VISIBLE_DEVICES names it for a server: as the user named it, else by index.
    visible_as: str | None = None

    @property
    def device(self) -> str:
        return self.visible_as or str(self.index)


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


QUERY = "--query-gpu=index,uuid,name,memory.total"


def parse_nvidia_smi_csv(text: str) -> tuple[Gpu, ...]:
    """Parse `nvidia-smi --query-gpu=index,uuid,name,memory.total --format=csv,noheader,nounits`."""
    gpus = []
    for line in text.strip().splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) < 3 or not parts[0].isdigit():
            continue
        mem = int(parts[3]) if len(parts) > 3 and parts[3].isdigit() else None
        gpus.append(Gpu(int(parts[0]), parts[2], mem, uuid=parts[1]))
    return tuple(gpus)


def _visible(env: dict[str, str]) -> list[str] | None:
    raw = env.get("CUDA_VISIBLE_DEVICES")
    if raw is None:
        return None
    return [x.strip() for x in raw.split(",") if x.strip()]


def _narrow(gpus: tuple[Gpu, ...], visible: list[str]) -> tuple[Gpu, ...]:
    """The devices CUDA_VISIBLE_DEVICES names, in its order, each kept under the name given.

    CUDA stops at the first entry that names no device; so does this.
    """
    by_index = {str(g.index): g for g in gpus}
    kept: list[Gpu] = []
    for token in visible:
        if token.isdigit():
            gpu = by_index.get(token)
        elif token.startswith("MIG-"):
            gpu = Gpu(len(gpus) + len(kept), f"MIG instance {token}")
        else:  # a GPU UUID, or a unique prefix of one
            gpu = next((g for g in gpus if g.uuid and g.uuid.startswith(token)), None)
        if gpu is None:
            break
        if any(k.index == gpu.index for k in kept):
            raise ConfigError(_duplicated(visible, gpu))
        kept.append(replace(gpu, visible_as=token))
    return tuple(kept)


def _duplicated(visible: list[str], gpu: Gpu) -> str:
    return (
        f"CUDA_VISIBLE_DEVICES={','.join(visible)} names GPU {gpu.index} more than once. To put "
        "several servers on one GPU (co-location), name it once: pdcheck shares the GPUs it is "
        "given when a topology needs more than there are, with a memory share and a staged start "
        "per server (a GPU named twice would count as two, each server taking vLLM's default "
        "share, and the second could not start). Name each GPU once."
    )


def read_inventory(
    *, env: dict[str, str] | None = None, nvidia_smi: str | None = None
) -> GpuInventory:
    """The GPUs this process may use. `nvidia_smi` names the executable (tests pass a fake)."""
    env = dict(os.environ) if env is None else env
    exe = nvidia_smi or shutil.which("nvidia-smi")
    visible = _visible(env)
    if exe:
        try:
            proc = subprocess.run(
                [exe, QUERY, "--format=csv,noheader,nounits"],
                capture_output=True,
                text=True,
                timeout=20,
            )
        except (OSError, subprocess.TimeoutExpired):
            proc = None
        if proc is not None and proc.returncode == 0:
            gpus = parse_nvidia_smi_csv(proc.stdout)
            if visible is not None:
                gpus = _narrow(gpus, visible)
            return GpuInventory(gpus, "nvidia-smi")
    if visible:
        if len(set(visible)) != len(visible):
            duplicate = next(t for t in visible if visible.count(t) > 1)
            raise ConfigError(
                _duplicated(visible, Gpu(visible.index(duplicate), "unknown", visible_as=duplicate))
            )
        return GpuInventory(
            tuple(Gpu(i, "unknown", visible_as=token) for i, token in enumerate(visible)),
            "CUDA_VISIBLE_DEVICES",
        )
    return GpuInventory((), "none")
