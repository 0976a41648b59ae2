"""The queueing section: levels whose client concurrency exceeds what a server runs at once.

`concurrency` only sizes the eval client's semaphore. A baseline server, or a PD decoder, runs
at most its `max_num_seqs` requests at once; above that the extra requests wait in its queue,
so the level measures queueing as much as PD (issue 40). Read from the argv each server ran
with (cell.json), through `contracts.vllm_batch`.
"""

from __future__ import annotations

from pdcheck.contracts.vllm_batch import BatchLimit, batch_limit, level_notes
from pdcheck.results.load import CellResult, RunResults

__all__ = ["queueing_section"]


def queueing_section(run: RunResults) -> str | None:
    """The section's markdown, or None when no level of the run exceeds its servers' limits."""
    lines = []
    for cell in run.cells:
        decoders = [s for t in cell.servers for s in t.servers if s.role == "decode"]
        notes = level_notes(
            cell.concurrency,
            baseline=_baseline_limit(run, cell),
            decoder=_limit(cell, "decode"),
            # Distinct decoder processes of one topology: the proxy spreads requests over them.
            decoders=max(1, len({s.name for s in decoders})),
        )
        lines += [f"- `{cell.name}` {note}" for note in notes]
    if not lines:
        return None
    return "\n".join(
        [
            "Each level's concurrency only sizes the client's pool of requests; a server runs at "
            "most its max-num-seqs of them at once and queues the rest. These levels measure "
            "queueing too:",
            "",
            *lines,
        ]
    )


def _limit(cell: CellResult, role: str) -> BatchLimit | None:
    for topology in cell.servers:
        for server in topology.servers:
            if server.role == role:
                return batch_limit(server.argv, platform=topology.platform)
    return None


def _baseline_limit(run: RunResults, cell: CellResult) -> BatchLimit | None:
    """The cell's own baseline server, else the one of the cell whose baseline it reused."""
    own = _limit(cell, "baseline")
    if own is not None or cell.baseline_key is None:
        return own
    for other in run.cells:
        if other.baseline_key == cell.baseline_key and (found := _limit(other, "baseline")):
            return found
    return None
