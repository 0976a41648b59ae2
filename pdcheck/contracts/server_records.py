"""What a run folder records of the servers that served it, defined once for both sides.

`pdcheck.serving` fills these in as it starts servers and reads their counters; the results
schema (`pdcheck.results.schema`) stores them in cell.json and the KV evidence files, and its
reader loads them back. Here, below both layers, so that the file's schema does not import
the code that starts servers.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Literal

__all__ = ["KvTransferMetrics", "Platform", "Role", "ServerPorts", "ServerRecord", "TopologyRecord"]

Platform = Literal["cpu", "gpu"]
# The server roles of a cell: a PD topology's prefill and decode servers, and its no-PD baseline.
Role = Literal["prefill", "decode", "baseline"]


@dataclass(frozen=True)
class ServerPorts:
    """The ports one server owns: HTTP, NIXL side channel, and VLLM_PORT's base.

    vLLM's NIXL side channel is one listener per engine at VLLM_NIXL_SIDE_CHANNEL_PORT + the
    engine's data-parallel index, serving every TP rank (nixl/base_scheduler.py), so a server
    without data parallelism listens on `side_channel` alone.
    """

    http: int
    side_channel: int
    vllm_port: int


@dataclass(frozen=True)
class ServerRecord:
    """One server process pdcheck started, as it ran."""

    name: str
    role: Role
    pid: int
    argv: tuple[str, ...]
    env: dict[str, str]  # what pdcheck set on top of its own environment
    url: str
    ports: ServerPorts
    gpus: tuple[str, ...]  # as CUDA_VISIBLE_DEVICES named them; empty on CPU
    cpu_bind: str | None
    log_path: str
    plugin_dir: str
    # The Ray node that ran it (`--backend ray`): its id and address; None: pdcheck's machine.
    node: str | None = None


@dataclass(frozen=True)
class TopologyRecord:
    """The servers that served one job: a baseline, or PD servers and the proxy (in pdcheck's
    process) in front of them. Prefill servers kept from an earlier job are among them."""

    platform: Platform
    servers: tuple[ServerRecord, ...]
    proxy_url: str | None = None


@dataclass(frozen=True)
class KvTransferMetrics:
    """KV-transfer counters of one or more decoders (summed over engines and label sets)."""

    external_kv_tokens: float = 0.0
    local_compute_tokens: float = 0.0
    transfers: float = 0.0
    bytes_transferred: float = 0.0
    failed_transfers: float = 0.0
    # Prompt tokens a decoder found in its own prefix cache: beside external tokens, each is
    # part of a partial prefix hit (the read covered only the blocks after it).
    local_cache_hit_tokens: float = 0.0
    # Engines exporting NIXL's counters at all (vLLM exports them, at 0, from start-up): without
    # them, 0 transfers says nothing (another connector, or a stand-in server). Not a counter:
    # a delta keeps the later reading's value.
    nixl_engines: float = 0.0

    def minus(self, before: KvTransferMetrics) -> KvTransferMetrics:
        """What happened between `before` and this reading."""
        deltas = {k: v - getattr(before, k) for k, v in asdict(self).items()}
        return KvTransferMetrics(**(deltas | {"nixl_engines": self.nixl_engines}))

    def plus(self, other: KvTransferMetrics) -> KvTransferMetrics:
        return KvTransferMetrics(**{k: v + getattr(other, k) for k, v in asdict(self).items()})

    def to_dict(self) -> dict[str, float]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> KvTransferMetrics:
        """A stored reading; a counter added since it was written reads 0."""
        return cls(**{k: float(data.get(k, 0.0)) for k in asdict(cls())})
