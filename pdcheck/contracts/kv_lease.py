"""How long a NIXL prefiller holds a request's KV blocks for the decoder's read, from its connector config.

A prefiller that sends a request's KV keeps its blocks until a decoder reports the read, or
until the request's lease expires; the decoder's heartbeat renews the lease while it waits. The
numbers are read from each release's own code (`nixl/scheduler.py` and `nixl/worker.py` in
0.23.0, `base_scheduler.py` and `base_worker.py` in 0.31.0 and 0.32.0): the lease is the
connector's extra config `kv_lease_duration` (default 30 s), the heartbeat comes every
`duration // 6` s and extends the lease to `duration * 2 // 3` s from then. Neither the report
nor judging runs in a vLLM process, so the default is copied here.

So with a live decoder a lease expires only after its heartbeat stalled for the extension; a
read of freed blocks is a prefiller that freed them early, or a decoder that stalled that long.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

__all__ = ["DEFAULT_LEASE_S", "KvLease", "kv_lease"]

DEFAULT_LEASE_S = 30


@dataclass(frozen=True)
class KvLease:
    """A prefiller's lease on the blocks it sends, and where the number comes from."""

    duration_s: int
    source: str  # "vLLM's default" or the flag it was set with

    @property
    def heartbeat_s(self) -> int:
        return self.duration_s // 6

    @property
    def extension_s(self) -> int:
        return self.duration_s * 2 // 3

    def describe(self) -> str:
        return (
            f"lease {self.duration_s} s ({self.source}), renewed by the decoder's heartbeat every "
            f"{self.heartbeat_s} s for {self.extension_s} s"
        )


def kv_lease(transfer_config: str | None) -> KvLease:
    """The lease of a server started with this `--kv-transfer-config` value (vLLM's default
    when it gives none, or none that reads)."""
    if transfer_config is not None:
        try:
            extra = json.loads(transfer_config).get("kv_connector_extra_config") or {}
            duration = extra.get("kv_lease_duration")
        except (ValueError, AttributeError):
            duration = None
        if isinstance(duration, int | float) and duration > 0:
            return KvLease(int(duration), "--kv-transfer-config kv_lease_duration")
    return KvLease(DEFAULT_LEASE_S, "vLLM's default")
