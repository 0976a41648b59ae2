"""pdcheck's own records of what one scheduled step means for the KV cache.

Everything outside ``pdcheck._vllm`` sees these records and plain values, never vLLM objects;
:mod:`pdcheck._vllm.capture` builds them from the live scheduler.
"""

from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple


@dataclasses.dataclass(frozen=True, slots=True)
class GroupInfo:
    """One KV cache group as the checker sees it: attention token slots or one Mamba state per block."""

    kind: str  # "attention" | "mamba"
    block_size: int


@dataclasses.dataclass(frozen=True, slots=True)
class ScheduledRequest:
    """One request in a dispatched step: it writes tokens [start, start + num_tokens)."""

    request_id: str
    start: int
    num_tokens: int
    block_ids: tuple[tuple[int, ...], ...]  # per KV group, as the worker sees them for this step
    samples: bool  # False for a partial prefill chunk (its sampled token is discarded)
    incarnation: int  # the request's preemption count at dispatch


@dataclasses.dataclass(frozen=True, slots=True)
class LoadStart:
    """A connector load started by a step: tokens [start, end) land in block_ids."""

    request_id: str
    block_ids: tuple[tuple[int, ...], ...]
    start: int
    end: int


@dataclasses.dataclass(frozen=True, slots=True)
class StepRecord:
    """Everything a dispatched step does to KV memory; ``output`` is vLLM's SchedulerOutput, opaque here."""

    fence_seq: (
        int  # the scheduler's sched_step_seq after this step (0 when block freeing is not deferred)
    )
    requests: tuple[ScheduledRequest, ...]
    zero_block_ids: tuple[int, ...]
    block_copies: tuple[tuple[int, int], ...]
    loads: tuple[LoadStart, ...]
    finished_ids: tuple[str, ...]
    preempted_ids: tuple[str, ...]
    output: Any = dataclasses.field(repr=False, compare=False)


@dataclasses.dataclass(frozen=True, slots=True)
class FreeRecord:
    """A request's blocks leaving it: at once, or deferred behind a fence step."""

    request_id: str
    deferred: bool
    fence_seq: int


class TraceStep(NamedTuple):
    """A dispatched step as the trace records it: block ids as the worker receives them (deltas).

    Captured on the scheduler's thread as cheap copies of the SchedulerOutput's columns (C-level list
    and dict copies, no loop over the running requests, no sorting); :meth:`rows` and the recorder turn
    them into the trace's rows later, on the writer thread. Block id lists are copied because an
    in-process worker extends the lists of new and resumed requests in place. Built from the
    SchedulerOutput alone, so recording costs no walk over the block tables.
    """

    fence_seq: int
    new_rows: list[tuple[Any, ...]]  # (request id, start, num tokens, block ids per group, "new")
    counts: dict[str, int]  # request id -> tokens scheduled this step
    cached_ids: list[str]
    cached_starts: list[int]
    cached_blocks: list[Any]  # per cached request: blocks added per group, or None
    resumed: frozenset[str]
    zero_block_ids: tuple[int, ...]
    loads: tuple[LoadStart, ...]
    finished_ids: tuple[str, ...]  # set order; the recorder sorts
    preempted_ids: tuple[str, ...]

    def rows(self) -> list[tuple[Any, ...]]:
        """``(request id, start, num tokens, block ids per group or None, mode)`` per scheduled request.

        Mode "new" and "resumed" carry the whole table, "cached" only the blocks added this step.
        """
        counts, resumed = self.counts, self.resumed
        rows = list(self.new_rows)
        for request_id, start, blocks in zip(
            self.cached_ids, self.cached_starts, self.cached_blocks, strict=False
        ):
            rows.append(
                (
                    request_id,
                    start,
                    counts[request_id],
                    blocks,
                    "resumed" if request_id in resumed else "cached",
                )
            )
        return rows
