"""The scheduler trace format: one compact JSONL file per vLLM process, written by the trace recorder.

Pure (no vLLM import): the recorder encodes with these functions and ``pdcheck trace check``
decodes with them. Event lines, in the order the scheduler produced them (list fields that would
be empty are left out; readers default them to ``[]``):

- ``{"e": "start", "schema_version", "pid", "t", "vllm", "groups": [[kind, block_size], ...], "defer_block_free", "needs_zeroing"}``
- ``{"e": "step", "i", "fence", "t", "reqs": [[request_id, start, num_tokens, [[block ids] per group] or null, mode], ...],
  "zero": [block ids], "loads": [[request_id, [[block ids] per group], start, end], ...], "finished": [...], "preempted": [...]}``:
  a dispatched step (``i`` counts from 1; ``fence`` is vLLM's sched_step_seq after it). Block ids are what
  the worker receives: mode "new" or "resumed" gives the whole table, "cached" only the blocks added
  (null: none), to be appended to the request's table
- ``{"e": "done", "i", "t", "n", "ok": [...], "failed": [...], "invalid": [...]}``: the output of step ``i`` was
  processed (steps are processed first in, first out); ok/failed are connector loads it reported finished
- ``{"e": "free", "rid", "deferred", "fence", "t"}``: a request's blocks left it (at once, or deferred until
  step ``fence`` is processed)
"""

from __future__ import annotations

import dataclasses
import glob
import json
import os
from typing import Any

import msgspec

from pdcheck.errors import ConfigError

SCHEMA_VERSION = 1
FILE_GLOB = "trace-*.jsonl"


def trace_file_name(pid: int) -> str:
    return f"trace-{pid}.jsonl"


def encode(event: dict[str, Any]) -> bytes:
    """One event as its UTF-8 JSON line, line end included."""
    return _encode(event) + b"\n"


# msgspec (which vLLM brings) encodes an event ~7x faster than json.dumps; the recorder's writer
# thread shares the GIL with the scheduler, so its time is the scheduler's.
_encode = msgspec.json.Encoder().encode


@dataclasses.dataclass(frozen=True)
class TraceFile:
    """One process's trace: its path and decoded events (dicts with key "e")."""

    path: str
    events: tuple[dict[str, Any], ...]


def read_trace_dir(path: str) -> list[TraceFile]:
    """Every trace file under ``path``; raises ConfigError when there is none or a line is not valid."""
    if not os.path.isdir(path):
        raise ConfigError(
            f"trace directory {path!r} does not exist; pass the PDCHECK_TRACE_DIR a run wrote to"
        )
    files = sorted(glob.glob(os.path.join(path, FILE_GLOB)))
    if not files:
        raise ConfigError(
            f"no {FILE_GLOB} files in {path!r}; was the server started with PDCHECK_TRACE_DIR set?"
        )
    out = []
    for name in files:
        events = []
        with open(name, encoding="utf-8") as fh:
            for lineno, line in enumerate(fh, 1):
                if not line.strip():
                    continue
                try:
                    event = json.loads(line)
                except json.JSONDecodeError:
                    if lineno > 1 and not line.endswith("\n"):
                        break  # a process killed mid-write leaves a torn last line
                    raise ConfigError(f"{name}:{lineno}: not a JSON trace event") from None
                if not isinstance(event, dict) or "e" not in event:
                    raise ConfigError(f"{name}:{lineno}: trace events are objects with key 'e'")
                events.append(event)
        out.append(TraceFile(name, tuple(events)))
    return out
