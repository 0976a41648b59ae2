"""Where a cell's client concurrency exceeds what its baseline server or a PD decoder runs at
once, from the argv pdcheck builds for them (`contracts.vllm_batch` reads the limit)."""

from __future__ import annotations

from pdcheck.config import Cell
from pdcheck.config.cells import Role
from pdcheck.contracts.vllm_batch import BatchLimit, batch_limit, level_notes
from pdcheck.serving.argv import Platform, build_serve_argv

__all__ = ["queueing_lines"]


def queueing_lines(cell: Cell, *, platform: Platform) -> list[str]:
    """`c<N>: concurrency ... > decoder max-num-seqs ...` per level that only queues more."""
    return level_notes(
        cell.concurrency,
        baseline=_limit(cell, "baseline", platform),
        decoder=_limit(cell, "decode", platform),
        decoders=cell.decode_instances,
    )


def _limit(cell: Cell, role: Role, platform: Platform) -> BatchLimit | None:
    # The launcher and port do not change the limit; a co-located server's memory share does
    # not either (vLLM's default depends on the GPU's total memory, not the share).
    argv = build_serve_argv(cell, role=role, port=0, platform=platform, launcher=())
    return batch_limit(argv, platform=platform)
