"""KV-integrity digests: what the prefiller wrote against what the decoder is about to read.

A race corrupts a few KV blocks of one request; whether that flips a GSM8K answer depends on
the model and the question, but the bytes always differ. So with `PDCHECK_KV_DIGEST=1` the
plugin writes, per request, transfer group and block position, a digest of the block's bytes:

- on the **prefiller**, for each request whose blocks a decoder will read, at the start of the
  step after its prefill forward (`pdcheck._vllm.kv_digest_hooks` says why nothing can have
  freed them yet). An attention group's blocks are taken from the request's own block table by
  position, not from the list the prefiller advertises; the record also says, for each
  advertised block, the table position it holds. So an advertised list in the wrong order, or
  naming other blocks, shows twice: in that list against the table, and in the decoder's
  digests, which then hold other positions' bytes;
- on the **decoder**, for each receive that finished without failure, at the start of the next
  step: after the load landed (the receive hook saw it done), after any fault injection (that
  hook runs at the end of the step the load finished in), after the step's block zeroing was
  queued (`_update_states` runs first), and before the forward, the first that can read them.
  A block-reuse race (the prefiller's blocks rewritten before the read, or a step in flight
  writing into the decoder's blocks) and a zeroing race (loaded blocks zeroed after the load)
  both change the bytes seen there.

Only the token slots the prefiller computed are digested: a partly filled last attention block
on those slots (the decoder recomputes the rest itself), a state (Mamba/GDN) group's one
state-bearing block whole. Positions count from the start of the prompt, so a decoder with a
prefix-cache hit (it loads only the tail) lines up with the prefiller's full list.

The digest is a keyed linear hash: the block's bytes viewed as int32 (uint8 when the size is
not a multiple of 4), times a fixed pseudo-random odd int64 weight per word, summed with int64
wraparound, and combined over the group's layers with a per-layer odd factor. It runs where the
KV lives (torch, the GPU's stream on CUDA), and all of a step's digests leave the device in one
copy. Zeroed or stale blocks change it except with probability about 2**-64; it is not a defence
against an adversary.

Records (one JSON line per request, side and TP rank, one `write()` on O_APPEND) go to
`<plugin dir>/kv-digests.jsonl`; `pdcheck.analysis.kv_digest` joins them on the prefiller's
request id (the decoder knows it as `remote_request_id`) and block position.
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec

from pdcheck._vllm.kv_digest_hooks import SentRequest, token_dim
from pdcheck._vllm.worker import LoadedGroup, LoadedRequest
from pdcheck.contracts.plugin_files import DIGESTS_FILE, DigestRecord
from pdcheck.vllm_plugin.marker import append_jsonl
from pdcheck.vllm_plugin.selection import client_request_id

__all__ = ["KvDigester"]

SCHEMA_VERSION = 1
_MASK = (1 << 64) - 1
_GOLDEN = 0x9E3779B97F4A7C15
_LAYER_MIX = 0x2545F4914F6CDD1D


@dataclass(frozen=True)
class _Blocks:
    """One group's blocks to digest: ids, their first position, and the filled slots of the last."""

    group_index: int
    is_state: bool
    first_position: int
    block_ids: tuple[int, ...]
    last_slots: int | None  # token slots of the last block; None: whole blocks
    tensors: tuple[Any, ...]
    token_dim: int | None
    # Prefiller: the table position each advertised block holds (see DigestGroup).
    held_positions: tuple[int, ...] | None = None
    block_size: int | None = None


class KvDigester:
    """Receives the prefiller's sent requests and the decoder's finished loads on one worker."""

    def __init__(self, plugin_dir: Path, *, clock: Callable[[], float] = time.time):
        plugin_dir.mkdir(parents=True, exist_ok=True)
        self.path = plugin_dir / DIGESTS_FILE
        self._clock = clock
        self._loaded: list[LoadedRequest] = []  # decoder: finished loads awaiting their first step
        self._weights: dict[tuple[int, str], Any] = {}

    def on_loaded(self, requests: Sequence[LoadedRequest]) -> None:
        """Decoder, end of a step: remember the loads; they are digested when the next step starts."""
        self._loaded += [r for r in requests if r.remote_request_id and r.num_tokens]

    def on_step_start(self, sent: Sequence[SentRequest]) -> None:
        """Start of a step, before its forward: digest the prefiller's sent and the decoder's loaded blocks."""
        loaded, self._loaded = self._loaded, []
        records = [self._sent_record(r) for r in sent if r.num_tokens > 0]
        records += [self._loaded_record(r) for r in loaded]
        if not records:
            return
        import torch

        parts = [d for _, groups in records for _, d in groups]
        values = iter(torch.cat(parts).tolist()) if parts else iter(())  # one device-to-host copy
        for head, groups in records:
            for group, _ in groups:
                n = group.pop("n")
                group["digests"] = [f"{next(values) & _MASK:016x}" for _ in range(n)]
            head["groups"] = [group for group, _ in groups]
            # Through the one schema the reader decodes with, so a line of another shape is
            # refused here, in the server, not when the run is judged.
            append_jsonl(self.path, msgspec.to_builtins(msgspec.convert(head, DigestRecord)))

    def _sent_record(self, request: SentRequest) -> tuple[dict, list]:
        dim = token_dim(request.kv_cache_layout)
        tables = request.tables or (None,) * len(request.groups)
        blocks = [
            _prefill_blocks(g, table, request.num_tokens, dim)
            for g, table in zip(request.groups, tables, strict=True)
        ]
        return (
            self._head("prefill", request.request_id, request.request_id, request.num_tokens)
            | {"tp_rank": request.tp_rank, "tp_size": request.tp_size},
            self._digest_groups(blocks),
        )

    def _loaded_record(self, request: LoadedRequest) -> tuple[dict, list]:
        assert request.remote_request_id is not None and request.num_tokens is not None
        dim = token_dim(request.kv_cache_layout)
        blocks = [_decode_blocks(g, request.num_tokens, dim) for g in request.groups]
        return (
            self._head("decode", request.request_id, request.remote_request_id, request.num_tokens)
            | {
                "tp_rank": request.tp_rank,
                "tp_size": request.tp_size,
                "remote_tp_size": request.remote_tp_size,
                "load_tokens": request.load_tokens,
            },
            self._digest_groups(blocks),
        )

    def _head(self, side: str, request_id: str, prefill_id: str, num_tokens: int) -> dict:
        return {
            "schema_version": SCHEMA_VERSION,
            "side": side,
            "prefill_request_id": prefill_id,
            "request_id": request_id,
            "x_request_id": client_request_id(request_id),
            "num_tokens": num_tokens,
            "pid": os.getpid(),
            "t": self._clock(),
        }

    def _digest_groups(self, groups: Sequence[_Blocks | None]) -> list[tuple[dict, Any]]:
        out = []
        for b in groups:
            if b is None or not b.block_ids or not b.tensors:
                continue
            head: dict[str, Any] = {
                "group": b.group_index,
                "state": b.is_state,
                "first_position": b.first_position,
                "n": len(b.block_ids),
            }
            if b.held_positions is not None:
                head |= {"held_positions": list(b.held_positions), "block_size": b.block_size}
            out.append((head, self._digest(b)))
        return out

    def _digest(self, blocks: _Blocks) -> Any:
        """int64 [n]: one digest per block, over every layer of the group."""
        import torch

        total = None
        # One host-to-device copy of the ids per group: its layers share a device.
        index = torch.tensor(blocks.block_ids, dtype=torch.long, device=blocks.tensors[0].device)
        for layer, tensor in enumerate(blocks.tensors):
            rows = tensor.index_select(0, index)
            if blocks.last_slots is not None and blocks.token_dim is not None:
                tail = self._hash(rows[-1:].narrow(blocks.token_dim, 0, blocks.last_slots))
                per_block = torch.cat([self._hash(rows[:-1]), tail]) if len(rows) > 1 else tail
            else:
                per_block = self._hash(rows)
            per_block = per_block * _signed(((layer + 1) * _LAYER_MIX) | 1)
            total = per_block if total is None else total + per_block
        return total

    def _hash(self, rows: Any) -> Any:
        import torch

        n = rows.shape[0]
        flat = rows.contiguous().reshape(n, -1).view(torch.uint8)
        if flat.shape[1] % 4 == 0:
            flat = flat.view(torch.int32)
        words = flat.to(torch.int64)
        return (words * self._weight(words.shape[1], words.device)).sum(dim=1)

    def _weight(self, n_words: int, device: Any) -> Any:
        """The same odd pseudo-random int64 per word position in every process: a fixed formula."""
        import torch

        key = (n_words, str(device))
        if key not in self._weights:
            w = torch.arange(1, n_words + 1, dtype=torch.int64, device=device) * _signed(_GOLDEN)
            w = w ^ (w >> 29)
            self._weights[key] = w | 1
        return self._weights[key]


def _signed(value: int) -> int:
    value &= _MASK
    return value - (1 << 64) if value >= 1 << 63 else value


def _prefill_blocks(
    group: LoadedGroup, table: tuple[int, ...] | None, num_tokens: int, dim: int
) -> _Blocks | None:
    """The prefiller holds the whole prompt: the blocks covering `num_tokens`, from the request's
    block table (`table`) where there is one, else from the advertised list from position 0."""
    if group.is_state:
        # The state-bearing block is the last one the exchange keeps.
        return _state(group, group.block_ids[-1:])
    block_size = _block_size(group, dim)
    if block_size is None:
        return None
    n_data = -(-num_tokens // block_size)
    if table is None:
        return _attention(group, group.block_ids[:n_data], 0, num_tokens, block_size, dim)
    # The advertised list is meant to be the table's tail (a sliding window keeps its last
    # blocks; a full-attention group all of them).
    first = max(0, len(table) - len(group.block_ids))
    blocks = _attention(group, table[first:n_data], first, num_tokens, block_size, dim)
    position = {b: p for p, b in enumerate(table)}
    held = tuple(position.get(b, -1) for b in group.block_ids)
    return dataclasses.replace(blocks, held_positions=held, block_size=block_size)


def _decode_blocks(group: LoadedGroup, num_tokens: int, dim: int) -> _Blocks | None:
    """The decoder loaded the tail of the prompt (all of it without a prefix-cache hit); a block
    beyond the loaded tokens (the token it recomputes) is not part of the transfer."""
    if group.is_state:
        return _state(group, group.block_ids[:1])
    block_size = _block_size(group, dim)
    if block_size is None:
        return None
    n_data = -(-num_tokens // block_size)
    ids = group.block_ids[:n_data]
    return _attention(group, ids, n_data - len(ids), num_tokens, block_size, dim)


def _state(group: LoadedGroup, ids: tuple[int, ...]) -> _Blocks:
    return _Blocks(group.group_index, True, 0, ids, None, group.tensors, None)


def _attention(
    group: LoadedGroup,
    ids: tuple[int, ...],
    first_position: int,
    num_tokens: int,
    block_size: int,
    dim: int,
) -> _Blocks:
    filled = num_tokens - (first_position + len(ids) - 1) * block_size
    last_slots = filled if 0 < filled < block_size else None
    return _Blocks(group.group_index, False, first_position, ids, last_slots, group.tensors, dim)


def _block_size(group: LoadedGroup, dim: int) -> int | None:
    return int(group.tensors[0].shape[dim]) if group.tensors else None
