"""Transfer evidence: what vLLM's own counters and logs say about the KV a PD unit moved.

Accuracy and the KV digests look at what the decoder computed and read; this looks at the
transfer's bookkeeping, which vLLM already emits, and which a lifecycle bug breaks even when
the bytes happen to survive:

- **Loaded without a transfer.** A decoder's ``/metrics`` counts the prompt tokens that
  arrived by KV transfer (``prompt_tokens_by_source{source="external_kv_transfer"}``) and
  the NIXL reads that completed (``nixl_xfer_time_seconds_count``, bytes). vLLM counts the
  tokens when the scheduler takes a load as finished, and a read when the worker sees it
  complete; a decoder that reports tokens loaded with no read completed took a load as
  finished before any read was done (issue 29's load-finished-early: 58,692 tokens, 0 reads).
  Nothing on a correct server produces it: a full local prefix hit loads nothing.
- **Released unread** (the prefiller's log, ``Releasing expired KV blocks for request ...
  retrieved by 0 remote worker(s)``): the prefiller let a request's lease expire and freed its
  blocks before any decoder read them.
- **Read after release** (``Potentially invalid KV blocks for unrecognized request ... were
  retrieved by a decode worker``): a decoder's read finished for blocks the prefiller had
  already freed, or whose lease it had let expire, so they may have held another request's KV
  by then (issue 29's early free: 1,203).

The first is impossible on a correct vLLM whatever the timing, so on a clean arm it is a
REGRESSION. The other two are findings about the prefiller: it freed blocks, or ended their
lease, before the read. The lease (`contracts.kv_lease`: 30 s by default, renewed by the
decoder's heartbeat every 5 s) expires with a live decoder only after its heartbeat stalled
for 20 s, which a badly overloaded machine can do with no bug; so on their own they make a
clean level SUSPECT rather than REGRESSION, with the counts and the lease (docs/analysis.md,
"Three signals"). Pure functions over parsed metrics and log text.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Protocol

from pdcheck.contracts.kv_lease import KvLease

__all__ = [
    "DecoderCounters",
    "PrefillerLogEvents",
    "TransferEvidence",
    "count_prefiller_log_events",
    "transfer_evidence",
]

_RELEASED = re.compile(
    r"Releasing expired KV blocks for request (\S+) which were retrieved by (\d+) remote worker"
)
_READ_AFTER_RELEASE = re.compile(r"Potentially invalid KV blocks for unrecognized request (\S+)")


class DecoderCounters(Protocol):
    """One decoder's KV-transfer counters over a unit (`pdcheck.serving.KvTransferMetrics`)."""

    @property
    def external_kv_tokens(self) -> float: ...
    @property
    def transfers(self) -> float: ...
    @property
    def bytes_transferred(self) -> float: ...
    @property
    def nixl_engines(self) -> float: ...


@dataclass(frozen=True)
class PrefillerLogEvents:
    """What one stretch of prefiller log says about released blocks."""

    released_unread: int = 0  # lease expired, 0 decoder workers had read them
    released_expired: int = 0  # lease expired, whatever the reads
    read_after_release: int = 0  # a decoder's read finished for blocks no longer held

    def plus(self, other: PrefillerLogEvents) -> PrefillerLogEvents:
        return PrefillerLogEvents(
            self.released_unread + other.released_unread,
            self.released_expired + other.released_expired,
            self.read_after_release + other.read_after_release,
        )


@dataclass(frozen=True)
class TransferEvidence:
    """One PD unit's transfer bookkeeping, summed over its decoders and prefillers."""

    loaded_kv_tokens: int
    completed_transfers: int
    bytes_transferred: int
    prefiller: PrefillerLogEvents
    # False when no decoder exported NIXL's counters (another connector, attach mode without
    # metrics URLs): then 0 completed transfers proves nothing.
    nixl_counted: bool = True
    lease: KvLease | None = None  # the prefillers' lease; None: not known (attach mode)

    @property
    def loaded_without_transfer(self) -> bool:
        return self.nixl_counted and self.loaded_kv_tokens > 0 and self.completed_transfers == 0

    def regression_reason(self) -> str | None:
        """On a clean arm: why this evidence alone is a REGRESSION, or None."""
        if not self.loaded_without_transfer:
            return None
        return (
            f"decoders report {self.loaded_kv_tokens} KV tokens loaded by transfer but "
            f"{self.completed_transfers} NIXL reads completed ({self.bytes_transferred} bytes): "
            "a load was taken as finished before its read was done"
        )

    def suspect_reason(self) -> str | None:
        """On a clean arm: why this evidence makes a passing level SUSPECT, or None."""
        parts = []
        if self.prefiller.read_after_release:
            parts.append(
                f"{self.prefiller.read_after_release} decoder reads finished for KV blocks the "
                "prefiller had already freed, or whose lease it had let expire, so they may have "
                "held another request's KV ('Potentially invalid KV blocks')"
            )
        if self.prefiller.released_unread:
            parts.append(
                f"the prefiller let {self.prefiller.released_unread} requests' leases expire and "
                "freed their KV blocks before any decoder read them ('retrieved by 0 remote "
                "worker(s)')"
            )
        if not parts:
            return None
        lease = (
            f"; {self.lease.describe()}: with a live decoder a lease expires only after its "
            f"heartbeat stalled {self.lease.extension_s} s"
            if self.lease is not None
            else ""
        )
        return "; ".join(parts) + lease


def count_prefiller_log_events(text: str) -> PrefillerLogEvents:
    """Count the release events in a stretch of a prefiller's log."""
    released = [int(m.group(2)) for m in _RELEASED.finditer(text)]
    return PrefillerLogEvents(
        released_unread=sum(1 for n in released if n == 0),
        released_expired=len(released),
        read_after_release=len(_READ_AFTER_RELEASE.findall(text)),
    )


def transfer_evidence(
    decoders: Iterable[DecoderCounters],
    prefiller: PrefillerLogEvents | None,
    *,
    lease: KvLease | None = None,
) -> TransferEvidence:
    """The unit's evidence from its decoders' metric deltas and its prefillers' log events."""
    deltas = list(decoders)
    events = prefiller if prefiller is not None else PrefillerLogEvents()
    return TransferEvidence(
        loaded_kv_tokens=int(sum(d.external_kv_tokens for d in deltas)),
        completed_transfers=int(sum(d.transfers for d in deltas)),
        bytes_transferred=int(sum(d.bytes_transferred for d in deltas)),
        prefiller=events,
        nixl_counted=any(d.nixl_engines > 0 for d in deltas),
        lease=lease,
    )
