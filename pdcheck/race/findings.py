"""Race findings as data: what went wrong, where, and the shortest slice of the run that shows it.

A finding is either a *hazard* (ownership: a step wrote or zeroed a block that the scheduler had
already given to another request) or *corruption* (content: a live request read a slot that does
not hold its own KV). Hazards are what a recorded trace can show; corruption needs the simulated
GPU order. Each detailed kind belongs to one race family, BLOCK_REUSE or ZEROING (OTHER for
connector bugs such as loading N tokens into a hybrid).
"""

from __future__ import annotations

import dataclasses
import enum
from typing import Any


class Family(enum.StrEnum):
    BLOCK_REUSE = "BLOCK_REUSE"
    ZEROING = "ZEROING"
    OTHER = "OTHER"


class Kind(enum.StrEnum):
    # hazards (ownership)
    STALE_WRITE_INTO_CONSUMER_BLOCK = "STALE_WRITE_INTO_CONSUMER_BLOCK"
    STALE_WRITE_INTO_LOCAL_BLOCK = "STALE_WRITE_INTO_LOCAL_BLOCK"
    STALE_MAMBA_WRITE_INTO_CONSUMER_BLOCK = "STALE_MAMBA_WRITE_INTO_CONSUMER_BLOCK"
    STALE_MAMBA_WRITE_INTO_LOCAL_BLOCK = "STALE_MAMBA_WRITE_INTO_LOCAL_BLOCK"
    ZEROING_OF_LOAD_TARGET = "ZEROING_OF_LOAD_TARGET"
    # corruption (content)
    CORRUPTION_STALE_KV_WRITE = "CORRUPTION_STALE_KV_WRITE"
    CORRUPTION_STALE_MAMBA_WRITE = "CORRUPTION_STALE_MAMBA_WRITE"
    CORRUPTION_MAMBA_STALE_WRITE = "CORRUPTION_MAMBA_STALE_WRITE"
    CORRUPTION_MAMBA_CLOBBERED_BY_STALE_KV_WRITE = "CORRUPTION_MAMBA_CLOBBERED_BY_STALE_KV_WRITE"
    CORRUPTION_ZEROED_AFTER_LOAD = "CORRUPTION_ZEROED_AFTER_LOAD"
    STALE_BYTES_VISIBLE = "STALE_BYTES_VISIBLE"
    CORRUPTION_MAMBA_WRONG_OWN_STATE = "CORRUPTION_MAMBA_WRONG_OWN_STATE"
    MAMBA_READ_NULL_BLOCK = "MAMBA_READ_NULL_BLOCK"
    # A live request reads KV that nobody computed for it: a zeroed slot that no load filled
    # (the scheduler counted tokens as computed that no group holds; vLLM 0.26.0's per-group hit).
    READ_UNCOMPUTED_KV = "READ_UNCOMPUTED_KV"
    CORRUPTION_KV_MISMATCH = "CORRUPTION_KV_MISMATCH"


FAMILY: dict[Kind, Family] = {
    Kind.STALE_WRITE_INTO_CONSUMER_BLOCK: Family.BLOCK_REUSE,
    Kind.STALE_WRITE_INTO_LOCAL_BLOCK: Family.BLOCK_REUSE,
    Kind.STALE_MAMBA_WRITE_INTO_CONSUMER_BLOCK: Family.BLOCK_REUSE,
    Kind.STALE_MAMBA_WRITE_INTO_LOCAL_BLOCK: Family.BLOCK_REUSE,
    Kind.ZEROING_OF_LOAD_TARGET: Family.ZEROING,
    Kind.CORRUPTION_STALE_KV_WRITE: Family.BLOCK_REUSE,
    Kind.CORRUPTION_STALE_MAMBA_WRITE: Family.BLOCK_REUSE,
    Kind.CORRUPTION_MAMBA_STALE_WRITE: Family.BLOCK_REUSE,
    Kind.CORRUPTION_MAMBA_CLOBBERED_BY_STALE_KV_WRITE: Family.BLOCK_REUSE,
    Kind.CORRUPTION_ZEROED_AFTER_LOAD: Family.ZEROING,
    Kind.STALE_BYTES_VISIBLE: Family.ZEROING,
    Kind.CORRUPTION_MAMBA_WRONG_OWN_STATE: Family.OTHER,
    Kind.MAMBA_READ_NULL_BLOCK: Family.OTHER,
    Kind.READ_UNCOMPUTED_KV: Family.OTHER,
    Kind.CORRUPTION_KV_MISMATCH: Family.OTHER,
}
HAZARD_KINDS = frozenset(
    {
        Kind.STALE_WRITE_INTO_CONSUMER_BLOCK,
        Kind.STALE_WRITE_INTO_LOCAL_BLOCK,
        Kind.STALE_MAMBA_WRITE_INTO_CONSUMER_BLOCK,
        Kind.STALE_MAMBA_WRITE_INTO_LOCAL_BLOCK,
        Kind.ZEROING_OF_LOAD_TARGET,
    }
)


@dataclasses.dataclass(frozen=True)
class Reproducer:
    """The shortest slice of the run around a finding: one line per step method call, and each block's owners."""

    seed: int
    variant: str
    lines: tuple[str, ...]
    owner_timelines: dict[int, tuple[str, ...]]
    options: str = ""  # the other `pdcheck race` options of the run (fix switches, depth, mutation)

    def render(self) -> str:
        """A replayable slice, like hypothesis's ``state.rule(...)`` program: the run is deterministic per seed."""
        command = f"pdcheck race --variant {self.variant} --seed-start {self.seed} --seeds 1 {self.options}".rstrip()
        out = [f"# replay: {command}", *self.lines]
        for block, events in sorted(self.owner_timelines.items()):
            out.append(f"# block {block}: " + "; ".join(events))
        return "\n".join(out)

    def to_dict(self) -> dict[str, Any]:
        return {
            "seed": self.seed,
            "variant": self.variant,
            "lines": list(self.lines),
            "owner_timelines": {str(b): list(e) for b, e in self.owner_timelines.items()},
            "options": self.options,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Reproducer:
        timelines = {int(b): tuple(e) for b, e in data["owner_timelines"].items()}
        return cls(
            data["seed"], data["variant"], tuple(data["lines"]), timelines, data.get("options", "")
        )


@dataclasses.dataclass(frozen=True)
class Finding:
    """One race seen in one run: kind, family, hazard or corruption, where, and how to see it again."""

    kind: Kind
    seed: int
    step: int  # dispatched steps so far when it was seen
    blocks: tuple[int, ...]
    victim: str  # the request whose KV or block it hit ("" when none)
    culprit: str  # the request whose stale step wrote, or "zeroing"/"load"
    detail: str
    propagated: bool = (
        False  # reached the victim through the prefix cache, not by its own write or load
    )
    reproducer: Reproducer | None = None

    @property
    def family(self) -> Family:
        return FAMILY[self.kind]

    @property
    def is_hazard(self) -> bool:
        return self.kind in HAZARD_KINDS

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": str(self.kind),
            "family": str(self.family),
            "hazard": self.is_hazard,
            "seed": self.seed,
            "step": self.step,
            "blocks": list(self.blocks),
            "victim": self.victim,
            "culprit": self.culprit,
            "detail": self.detail,
            "propagated": self.propagated,
            "reproducer": self.reproducer.to_dict() if self.reproducer else None,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Finding:
        rep = data.get("reproducer")
        return cls(
            kind=Kind(data["kind"]),
            seed=data["seed"],
            step=data["step"],
            blocks=tuple(data["blocks"]),
            victim=data["victim"],
            culprit=data["culprit"],
            detail=data["detail"],
            propagated=data.get("propagated", False),
            reproducer=Reproducer.from_dict(rep) if rep else None,
        )
