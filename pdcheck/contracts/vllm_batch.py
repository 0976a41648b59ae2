"""How many requests a vLLM server runs at once (`max_num_seqs`), read from its argv.

A client concurrency above it puts no more requests in flight: the extra ones wait in the
server's queue, so such a level measures queueing, not a larger batch (issue 40). The dry run
reads the argv pdcheck builds, the report the argv each server ran with (cell.json); neither
runs in a vLLM process, so vLLM's defaults are copied here from its source,
`EngineArgs.get_batch_defaults` in vllm/engine/arg_utils.py (0.32.0), for the OpenAI server:

- CPU: 128 x the world size (tensor x pipeline parallel);
- GPU: 256, or 1024 on a GPU of 70 GiB or more that is not an A100 (H100, H200, B200);
- both doubled by `--performance-mode throughput` when `--max-num-seqs` is not given.

Each data-parallel rank runs its own `max_num_seqs`, so `--data-parallel-size N` multiplies it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["BatchLimit", "batch_limit", "level_notes", "queueing_note"]

CPU_DEFAULT_PER_RANK = 128
GPU_DEFAULT = 256
LARGE_GPU_DEFAULT = 1024  # GPUs of 70 GiB or more, A100s excepted

# vLLM's spellings of the flags read here (its parser also takes underscores for dashes).
_FLAGS = {
    "--max-num-seqs": "max_num_seqs",
    "--tensor-parallel-size": "tp",
    "-tp": "tp",
    "--pipeline-parallel-size": "pp",
    "-pp": "pp",
    "--data-parallel-size": "dp",
    "-dp": "dp",
    "--performance-mode": "mode",
}


@dataclass(frozen=True)
class BatchLimit:
    """The requests one server runs at once: `low` to `high` (equal unless vLLM's default depends
    on which GPU runs it), and where the number comes from."""

    low: int
    high: int
    source: str


def batch_limit(argv: Sequence[str], *, platform: str) -> BatchLimit | None:
    """The server's limit, or None when a flag it depends on is not a number (vLLM's own parser
    refuses such an argv before the server starts)."""
    flags = _last_values(argv)
    try:
        explicit = int(flags["max_num_seqs"]) if "max_num_seqs" in flags else None
        tp, pp, dp = (int(flags.get(k, "1")) for k in ("tp", "pp", "dp"))
    except ValueError:
        return None
    ranks = f" x {dp} data-parallel ranks" if dp > 1 else ""
    if explicit is not None:
        return BatchLimit(explicit * dp, explicit * dp, f"--max-num-seqs {explicit}{ranks}")
    factor = (2 if flags.get("mode") == "throughput" else 1) * dp
    why = " x 2 (--performance-mode throughput)" if flags.get("mode") == "throughput" else ""
    if platform == "cpu":
        n = CPU_DEFAULT_PER_RANK * tp * pp * factor
        world = f"world size {tp * pp}"
        return BatchLimit(n, n, f"vLLM's CPU default, {CPU_DEFAULT_PER_RANK} x {world}{why}{ranks}")
    return BatchLimit(
        GPU_DEFAULT * factor,
        LARGE_GPU_DEFAULT * factor,
        f"vLLM's GPU default: {GPU_DEFAULT} on GPUs under 70 GiB and A100s, {LARGE_GPU_DEFAULT} "
        f"on larger ones{why}{ranks}",
    )


def queueing_note(
    concurrency: int, limit: BatchLimit, *, server: str, instances: int = 1
) -> str | None:
    """One line when `concurrency` requests (spread round-robin over `instances` servers, as the
    PD proxy spreads them over decoders) exceed what one server runs at once; else None."""
    load = math.ceil(concurrency / instances)
    if load <= limit.low:
        return None
    spread = f" over {instances} {server}s ({load} each)" if instances > 1 else ""
    head = f"concurrency {concurrency}{spread} > {server} max-num-seqs"
    if load > limit.high:
        return (
            f"{head} {limit.high} ({limit.source}): the extra requests queue; this level "
            "measures queueing"
        )
    return (
        f"{head} {limit.low} on some GPUs ({limit.source}): there the extra requests queue "
        "and this level measures queueing"
    )


def level_notes(
    levels: Sequence[int],
    *,
    baseline: BatchLimit | None,
    decoder: BatchLimit | None,
    decoders: int = 1,
) -> list[str]:
    """`c<N>: ...` for each level whose concurrency exceeds what the baseline server, or a PD
    decoder, runs at once; a None limit is one not known (the server not recorded, or its argv
    unreadable) and says nothing."""
    lines = []
    for c in sorted(levels):
        notes = (
            queueing_note(c, baseline, server="baseline") if baseline else None,
            queueing_note(c, decoder, server="decoder", instances=decoders) if decoder else None,
        )
        lines += [f"c{c}: {note}" for note in notes if note]
    return lines


def _last_values(argv: Sequence[str]) -> dict[str, str]:
    """The value the last spelling of each flag in `_FLAGS` gives (`--flag V` or `--flag=V`)."""
    found: dict[str, str] = {}
    for i, token in enumerate(argv):
        name, eq, value = token.partition("=")
        if name.startswith("--"):
            name = "--" + name[2:].replace("_", "-")
        key = _FLAGS.get(name)
        if key is None:
            continue
        if eq:
            found[key] = value
        elif i + 1 < len(argv):
            found[key] = argv[i + 1]
    return found
