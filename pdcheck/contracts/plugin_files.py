"""What the vLLM plugin leaves in a server's `PDCHECK_PLUGIN_DIR`, as both sides name it.

The plugin writes an activation marker per vLLM process (`activation-<pid>.json`) and adds to
its `did` list what that process did; serving reads the markers to trust an arm that needs the
plugin. Injected requests are logged one line each in the injections file, which the engine
copies into the results store.
"""

from __future__ import annotations

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
