"""A fake `nvidia-smi` executable that reports a simulated GPU inventory (for GPU-assignment tests).

`fake_nvidia_smi(dir, count)` writes an executable script answering the
`--query-gpu=index,uuid,name,memory.total --format=csv,noheader,nounits` query the inventory
reader sends, and exiting 9 like the real tool when asked something else. GPU i has the UUID
`fake_uuid(i)`. `fake_inventory(count)` is the inventory `read_inventory` makes of that
script's answer, for tests of planning that need no process.
"""

from __future__ import annotations

import stat
import sys
from pathlib import Path

from pdcheck.serving.gpus import GpuInventory, parse_nvidia_smi_csv

_SCRIPT = """#!{python}
import sys
LINES = {lines!r}
if any(a.startswith("--query-gpu=") for a in sys.argv[1:]):
    print("\\n".join(LINES))
    sys.exit(0)
if "-L" in sys.argv[1:]:
    print("\\n".join(f"GPU {{i}}: fake" for i in range(len(LINES))))
    sys.exit(0)
sys.exit(9)
"""


def fake_nvidia_smi(
    directory: str | Path,
    count: int,
    *,
    name: str = "NVIDIA H100 80GB HBM3",
    memory_mib: int = 81559,
) -> str:
    """Path of an executable that reports `count` GPUs with indices 0..count-1."""
    lines = _query_lines(count, name=name, memory_mib=memory_mib)
    path = Path(directory) / f"nvidia-smi-{count}"
    path.write_text(_SCRIPT.format(python=sys.executable, lines=lines))
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return str(path)


def fake_inventory(
    count: int, *, name: str = "NVIDIA H100 80GB HBM3", memory_mib: int = 81559
) -> GpuInventory:
    """The inventory `read_inventory` reads from `fake_nvidia_smi(dir, count)` with no
    CUDA_VISIBLE_DEVICES (tests/slow/test_gpu_inventory.py checks that they agree)."""
    text = "\n".join(_query_lines(count, name=name, memory_mib=memory_mib))
    return GpuInventory(parse_nvidia_smi_csv(text), "nvidia-smi")


def _query_lines(count: int, *, name: str, memory_mib: int) -> list[str]:
    return [f"{i}, {fake_uuid(i)}, {name}, {memory_mib}" for i in range(count)]


def fake_uuid(index: int) -> str:
    return f"GPU-00000000-0000-0000-0000-{index:012d}"
