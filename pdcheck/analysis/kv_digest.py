"""KV integrity: join the prefiller's and the decoder's block digests, and say which blocks differ.

The vLLM plugin (`PDCHECK_KV_DIGEST=1`, `pdcheck/vllm_plugin/kv_digest.py`) writes one line per
request, side and TP rank: per transfer group and block position, a digest of the token slots
the prefiller computed, taken on the prefiller before its blocks can be freed and on the decoder
right before the forward that first reads them. Equal digests mean the decoder reads the bytes
the prefill wrote; a race that rewrites, zeroes or swaps a block changes them. Accuracy sees a
race only when answers flip; a digest sees one corrupted block, which is why a mismatch on a
clean arm is evidence of a regression whatever the accuracy says, and why on an injection
canary the mismatched questions must be exactly the injected ones.

The prefiller's digests are of the request's own block table, by position; its record also
says which table position each block it advertised holds. A list advertised in the wrong order
(or naming other blocks) is an order mismatch, said with the positions where list and table
disagree, and a decoder that loads a block into another position than the one it holds
mismatches there. A prefiller record without the table (a vLLM the hook cannot read it from) is
counted as unchecked for order.

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
    "OrderMismatch",
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
class OrderMismatch:
    """A load whose prefiller advertised a block list that disagrees with the request's own block
    table: the blocks sent for `positions` hold the table's `held` positions (-1: a block not in
    the table), so the decoder loads them as another part of the prompt."""

    question: int | None
    x_request_id: str
    group: int
    tp_rank: int
    positions: tuple[int, ...]  # where the advertised list disagrees, from the prompt's start
    held: tuple[int, ...]  # the table position each of those blocks holds
    block_size: int | None  # token slots per block, for the token ranges
    num_tokens: int | None = None  # prompt tokens the prefiller computed (the last range's end)

    def describe(self) -> str:
        """The disagreement as a reviewer reads it: which positions, and what each block holds."""
        held = ", ".join(
            "a block not in the table"
            if h < 0
            else _token_range(h, self.block_size, self.num_tokens)
            for h in self.held
        )
        return (
            f"advertised block order disagrees with the block table at positions "
            f"{', '.join(map(str, self.positions))} ({_where(self.question, self.x_request_id)}, "
            f"group {self.group}: the blocks sent there hold {held})"
        )


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
    # Loads whose prefiller advertised blocks out of its block table's order (every one
    # counted, the first kept), and loads whose prefiller record carries no table to check.
    n_order_mismatches: int = 0
    order_mismatches: tuple[OrderMismatch, ...] = ()
    order_unchecked: int = 0


def join_digests(records: Iterable[DigestRecord], *, run_tag: str | None = None) -> KvDigestSummary:
    """Compare every decoder record of the run (`run_tag`, when given) with its prefiller's record.

    `records` are the lines of every server's `kv-digests.jsonl`, both sides mixed; prefiller
    lines of other runs are harmless (nothing joins them).
    """
    prefill: dict[tuple[str, int], dict[tuple[int, int], str]] = {}
    prefill_records: dict[tuple[str, int], DigestRecord] = {}
    decode = []
    for record in records:
        if record.side == "prefill":
            key = (record.prefill_request_id, record.tp_rank)
            prefill[key] = _blocks(record)
            prefill_records[key] = record
        elif run_tag is None or record.x_request_id.startswith(f"{run_tag}-q"):
            decode.append(record)
    refused = _heterogeneous_tp(decode)
    if refused is not None:
        return KvDigestSummary(0, 0, 0, (), (), refused=refused)
    requests = blocks = unmatched = unpaired = unchecked = 0
    mismatches: list[DigestMismatch] = []
    extents: list[ExtentMismatch] = []
    orders: list[OrderMismatch] = []
    for record in decode:
        key = (record.prefill_request_id, record.tp_rank)
        theirs = prefill.get(key)
        if theirs is None:
            unmatched += 1
            continue
        requests += 1
        order = _order_mismatches(prefill_records[key], record.x_request_id)
        if order is None:
            unchecked += 1
        orders += order or ()
        loaded, computed = record.load_tokens, prefill_records[key].num_tokens
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
    orders.sort(key=lambda o: (o.question is None, o.question or 0, o.group, o.tp_rank))
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
        n_order_mismatches=len({(o.x_request_id, o.tp_rank) for o in orders}),
        order_mismatches=tuple(orders[:_EXAMPLES]),
        order_unchecked=unchecked,
    )


def _order_mismatches(prefill: DigestRecord, x_request_id: str) -> list[OrderMismatch] | None:
    """Where a prefiller's advertised list disagrees with its block table, per attention group;
    None when the record carries no table for an attention group (nothing could be checked).

    `x_request_id` is the decoder's (the prefiller's own request never names the question).
    """
    attention = [g for g in prefill.groups if not g.state]
    if not attention or any(g.held_positions is None for g in attention):
        return None
    out = []
    for g in attention:
        assert g.held_positions is not None
        wrong = [
            (g.first_position + k, held)
            for k, held in enumerate(g.held_positions)
            if held != g.first_position + k
        ]
        if wrong:
            out.append(
                OrderMismatch(
                    question=_question(x_request_id),
                    x_request_id=x_request_id,
                    group=g.group,
                    tp_rank=prefill.tp_rank,
                    positions=tuple(p for p, _ in wrong),
                    held=tuple(h for _, h in wrong),
                    block_size=g.block_size,
                    num_tokens=prefill.num_tokens,
                )
            )
    return out


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
    if summary.n_order_mismatches:
        reasons.append(
            f"{summary.n_order_mismatches} of {summary.requests_checked} loads were advertised "
            f"out of the prefiller's block-table order (first: "
            f"{summary.order_mismatches[0].describe()})"
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


def _token_range(position: int, block_size: int | None, num_tokens: int | None) -> str:
    if block_size is None:
        return f"position {position}"
    end = (position + 1) * block_size
    return f"tokens {position * block_size}-{(end if num_tokens is None else min(end, num_tokens)) - 1}"


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
