"""What the vLLM plugin leaves in a server's `PDCHECK_PLUGIN_DIR`, as both sides name it.

The plugin writes an activation marker per vLLM process (`activation-<pid>.json`) and adds to
its `did` list what that process did; serving reads the markers to trust an arm that needs the
plugin. Injected requests are logged one `InjectionRecord` line each in the injections file,
which the engine copies into the results store and `pdcheck compare --injections` reads.
"""

from __future__ import annotations

import msgspec

ACTIVATION_GLOB = "activation-*.json"
INJECTIONS_FILE = "injections.jsonl"
# One line per request, side and TP rank with the digests of its transferred KV blocks.
DIGESTS_FILE = "kv-digests.jsonl"
# A vLLM scheduler was built in this process, after every fix switch was installed.
SCHEDULER_BUILT = "scheduler-built"
# This process registered NIXL KV caches with the KV-load hook (fault injection) installed.
KV_LOAD_HOOK_WITH_KV_CACHES = "kv-load-hook-with-kv-caches"


def activation_marker_name(pid: int) -> str:
    return f"activation-{pid}.json"


class InjectionRecord(msgspec.Struct, frozen=True, kw_only=True):
    """One injected request on one worker (TP rank): which request, which fault, which blocks.

    A line of the injections file, and an entry of a results folder's `kv/c<N>-r<k>.json`.
    """

    schema_version: int = 1
    # The client's X-Request-Id (`<run_tag>-q<index:05d>`): analysis maps it to the question.
    x_request_id: str
    request_id: str  # vLLM's internal request id on the worker
    kind: str
    fraction: float
    seed: int
    blocks: list[list[int]]  # per transfer group, the block ids overwritten (empty: untouched)
    pid: int
    tp_rank: int
    t: float
