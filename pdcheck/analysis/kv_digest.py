"""KV integrity: join the prefiller's and the decoder's block digests, and say which blocks differ.

The vLLM plugin (`PDCHECK_KV_DIGEST=1`, `pdcheck/vllm_plugin/kv_digest.py`) writes one line per
request, side and TP rank: per transfer group and block position, a digest of the token slots
the prefiller computed, taken on the prefiller before its blocks can be freed and on the decoder
right before the forward that first reads them. Equal digests mean the decoder reads the bytes
the prefill wrote; a race that rewrites, zeroes or swaps a block changes them. Accuracy sees a
race only when answers flip; a digest sees one corrupted block, which is why a mismatch on a
clean arm is evidence of a regression whatever the accuracy says, and why on an injection
canary the mismatched questions must be exactly the injected ones.

The join key is the prefiller's request id (the decoder knows it as vLLM's `remote_request_id`),
the TP rank, the group and the block position, counted from the start of the prompt. Pure
functions on the plugin's `DigestRecord`s; refusals are data, never a wrong comparison: when the two sides
ran at different TP sizes, rank r of the decoder holds another head slice than rank r of the
prefiller, so nothing is compared and `refused` says why.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

from pdcheck.contracts.plugin_files import DigestRecord

__all__ = [
    "DigestMismatch",
    "ExtentMismatch",
    "KvDigestSummary",
    "digest_regression_reason",
    "join_digests",
]

_QUESTION_SUFFIX = re.compile(r"-q(\d+)$")
# How many mismatches to keep as examples; the counts are always exact.
_EXAMPLES = 20


@dataclass(frozen=True)
class DigestMismatch:
    """One block whose digest differs between the prefiller and the decoder."""

    question: int | None  # from the decoder's X-Request-Id `-q<index>`; None for other ids
    x_request_id: str
    group: int  # transfer group (attention, or a Mamba/GDN state group)
    position: int  # block position from the start of the prompt
    tp_rank: int


@dataclass(frozen=True)
class ExtentMismatch:
    """A load the two sides disagree on: the decoder takes it to hold another number of prompt
    tokens than the prefiller computed (a hybrid's N-1 rule broken on one side)."""

    question: int | None
    x_request_id: str
    decoder_tokens: int
    prefiller_tokens: int


@dataclass(frozen=True)
class KvDigestSummary:
    """The join of one unit's digests: what was checked and what differed."""

    requests_checked: int  # decoder loads with a prefiller record to compare against
    blocks_checked: int
    n_mismatches: int
    mismatched_questions: tuple[int, ...]  # every one, sorted
    mismatches: tuple[DigestMismatch, ...]  # the first few
    # Decoder loads with no prefiller record (a prefiller without the switch, or its record lost).
    unmatched_requests: int = 0
    # Blocks one side digested and the other did not (the two disagree on the transfer's extent).
    unpaired_blocks: int = 0
    refused: str | None = None  # why nothing was compared
    # Loads whose token count differs between the two sides (every one counted, the first kept).
    n_extent_mismatches: int = 0
    extent_mismatches: tuple[ExtentMismatch, ...] = ()


def join_digests(records: Iterable[DigestRecord], *, run_tag: str | None = None) -> KvDigestSummary:
    """Compare every decoder record of the run (`run_tag`, when given) with its prefiller's record.

    `records` are the lines of every server's `kv-digests.jsonl`, both sides mixed; prefiller
    lines of other runs are harmless (nothing joins them).
    """
    prefill: dict[tuple[str, int], dict[tuple[int, int], str]] = {}
    prefill_tokens: dict[tuple[str, int], int | None] = {}
    decode = []
    for record in records:
        if record.side == "prefill":
            key = (record.prefill_request_id, record.tp_rank)
            prefill[key] = _blocks(record)
            prefill_tokens[key] = record.num_tokens
        elif run_tag is None or record.x_request_id.startswith(f"{run_tag}-q"):
            decode.append(record)
    refused = _heterogeneous_tp(decode)
    if refused is not None:
        return KvDigestSummary(0, 0, 0, (), (), refused=refused)
    requests = blocks = unmatched = unpaired = 0
    mismatches: list[DigestMismatch] = []
    extents: list[ExtentMismatch] = []
    for record in decode:
        key = (record.prefill_request_id, record.tp_rank)
        theirs = prefill.get(key)
        if theirs is None:
            unmatched += 1
            continue
        requests += 1
        loaded, computed = record.load_tokens, prefill_tokens[key]
        if loaded is not None and computed is not None and loaded != computed:
            x_request_id = record.x_request_id
            extents.append(ExtentMismatch(_question(x_request_id), x_request_id, loaded, computed))
        for (group, position), digest in _blocks(record).items():
            expected = theirs.get((group, position))
            if expected is None:
                unpaired += 1
                continue
            blocks += 1
            if digest != expected:
                mismatches.append(
                    DigestMismatch(
                        question=_question(record.x_request_id),
                        x_request_id=record.x_request_id,
                        group=group,
                        position=position,
                        tp_rank=record.tp_rank,
                    )
                )
    mismatches.sort(key=lambda m: (m.question is None, m.question or 0, m.group, m.position))
    return KvDigestSummary(
        requests_checked=requests,
        blocks_checked=blocks,
        n_mismatches=len(mismatches),
        mismatched_questions=tuple(
            sorted({m.question for m in mismatches if m.question is not None})
        ),
        mismatches=tuple(mismatches[:_EXAMPLES]),
        unmatched_requests=unmatched,
        unpaired_blocks=unpaired,
        n_extent_mismatches=len(extents),
        extent_mismatches=tuple(extents[:_EXAMPLES]),
    )


def digest_regression_reason(summary: KvDigestSummary | None) -> str | None:
    """On a clean arm: why the digests alone make this level a REGRESSION, or None when they do not.

    The hook for judging: any mismatch is corruption the accuracy test may have out-voted, and a
    load the two sides disagree on the extent of is one the decoder reads as something it is not.
    """
    if summary is None or summary.refused is not None:
        return None
    reasons = []
    if summary.n_mismatches:
        first = summary.mismatches[0]
        reasons.append(
            f"{summary.n_mismatches} of {summary.blocks_checked} KV blocks differ between "
            f"prefiller and decoder ({len(summary.mismatched_questions)} questions; first "
            f"{_where(first.question, first.x_request_id)}, group {first.group}, block "
            f"{first.position})"
        )
    if summary.n_extent_mismatches:
        e = summary.extent_mismatches[0]
        reasons.append(
            f"{summary.n_extent_mismatches} of {summary.requests_checked} loads hold another "
            f"number of prompt tokens than the decoder takes them to (first "
            f"{_where(e.question, e.x_request_id)}: prefiller {e.prefiller_tokens}, decoder "
            f"{e.decoder_tokens})"
        )
    return "; ".join(reasons) or None


def _where(question: int | None, x_request_id: str) -> str:
    return f"q{question:05d}" if question is not None else x_request_id


def _blocks(record: DigestRecord) -> dict[tuple[int, int], str]:
    return {
        (group.group, group.first_position + offset): digest
        for group in record.groups
        for offset, digest in enumerate(group.digests)
    }


def _heterogeneous_tp(decode: list[DigestRecord]) -> str | None:
    if any(r.remote_tp_size is None for r in decode):
        return "a decoder record does not say the prefiller's TP size, so no rank can be paired"
    sizes = {(r.tp_size, r.remote_tp_size or 0) for r in decode}
    odd = sorted((d, p) for d, p in sizes if d != p)
    if not odd:
        return None
    d, p = odd[0]
    return (
        f"prefiller TP {p} and decoder TP {d}: each decoder rank reads another head slice than "
        "the prefiller rank of the same index holds, and pdcheck does not yet map head slices, "
        "so the digests were not compared"
    )


def _question(x_request_id: str) -> int | None:
    m = _QUESTION_SUFFIX.search(x_request_id)
    return int(m.group(1)) if m else None
