"""Fault injection on a PD decoder: give a seeded fraction of requests the races' effects.

On CPU the two races cannot happen (async scheduling is off), so the pipeline is shown to flag
corruption by writing the races' *effects* into the KV a decoder has just received:

- `zero-loaded-kv` (the zeroing race): the loaded attention blocks are zeroed. State (Mamba)
  blocks are left alone, as in the race, where the attention layers lose the prompt and the
  state layers keep theirs.
- `stale-kv` (the block-reuse race): every loaded block, attention and state, is overwritten
  with content cloned from the previous receive's blocks on this worker. Cloned content, not
  block ids: sequential requests often get the same block ids, so copying ids copies a block
  onto itself (measured: a first version changed almost nothing). The first receive has no
  source yet and is left alone.

Invariants: a request is injected iff `is_selected(client id)`, except a stale-kv request with
no earlier receive; each group's layers are indexed only with that group's ids (cache groups
overlay one allocation); every injected request is logged with the blocks it changed, and
nothing that was not changed is logged: a stale-kv block whose source holds the same bytes is
left out (loaded KV is never all zeros, so every zeroed block counts). The ops are in-place on the registered KV tensors (CPU
or the current CUDA stream); the adapter calls `on_loaded` before any forward reads the KV.

Pitfall: a decoder with prefix caching caches a corrupted block and reuses it for later
requests with the same prefix, which then diverge without being injected. Serving turns
prefix caching off on injected decoders; a real race poisons the cache the same way.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Sequence

from pdcheck._vllm.worker import LoadedGroup, LoadedRequest
from pdcheck.vllm_plugin.marker import InjectionLog, InjectionRecord
from pdcheck.vllm_plugin.selection import client_request_id, is_selected
from pdcheck.vllm_plugin.settings import InjectKind, InjectSpec

__all__ = ["Injector"]

logger = logging.getLogger(__name__)

# group index -> that group's loaded blocks, one cloned tensor [n_blocks, ...] per layer
_Snapshot = dict[int, list]


class Injector:
    """Receives every finished load on one worker and corrupts the selected requests' blocks."""

    def __init__(
        self, spec: InjectSpec, log: InjectionLog, *, clock: Callable[[], float] = time.time
    ):
        self._spec = spec
        self._log = log
        self._clock = clock
        self._previous: _Snapshot | None = None  # stale-kv: the last receive's blocks, cloned

    def on_loaded(self, requests: Sequence[LoadedRequest]) -> None:
        for request in requests:
            client_id = client_request_id(request.request_id)
            selected = is_selected(client_id, fraction=self._spec.fraction, seed=self._spec.seed)
            if self._spec.kind is InjectKind.ZERO_LOADED_KV:
                changed = _zero_attention(request.groups) if selected else {}
            else:
                source, self._previous = self._previous, _snapshot(request.groups)
                changed = _overwrite(request.groups, source) if selected and source else {}
            if changed:
                self._record(request, client_id, changed)

    def _record(
        self, request: LoadedRequest, client_id: str, changed: dict[int, list[int]]
    ) -> None:
        n_groups = max(g.group_index for g in request.groups) + 1
        blocks = [changed.get(g, []) for g in range(n_groups)]
        self._log.append(
            InjectionRecord(
                x_request_id=client_id,
                request_id=request.request_id,
                kind=self._spec.kind.value,
                fraction=self._spec.fraction,
                seed=self._spec.seed,
                blocks=blocks,
                pid=os.getpid(),
                tp_rank=request.tp_rank,
                t=self._clock(),
            )
        )
        logger.debug(
            "pdcheck: injected %s into %s, blocks %s",
            self._spec.kind.value,
            request.request_id,
            blocks,
        )


def _index(ids: Sequence[int], tensor):
    import torch

    return torch.tensor(list(ids), dtype=torch.long, device=tensor.device)


def _zero_attention(groups: Sequence[LoadedGroup]) -> dict[int, list[int]]:
    changed = {}
    for group in groups:
        if group.is_state or not group.block_ids or not group.tensors:
            continue
        for tensor in group.tensors:
            tensor.index_fill_(0, _index(group.block_ids, tensor), 0)
        changed[group.group_index] = list(group.block_ids)
    return changed


def _snapshot(groups: Sequence[LoadedGroup]) -> _Snapshot:
    return {
        g.group_index: [t.index_select(0, _index(g.block_ids, t)) for t in g.tensors]
        for g in groups
        if g.block_ids and g.tensors
    }


def _overwrite(groups: Sequence[LoadedGroup], source: _Snapshot) -> dict[int, list[int]]:
    """Overwrite each loaded block with the source's blocks, cycling when the source is shorter."""
    import torch

    changed: dict[int, list[int]] = {}
    for group in groups:
        layers = source.get(group.group_index)
        if not group.block_ids or not layers:
            continue
        differs = None
        for tensor, stale in zip(group.tensors, layers, strict=True):
            rows = torch.arange(len(group.block_ids), device=stale.device) % stale.shape[0]
            index, content = _index(group.block_ids, tensor), stale.index_select(0, rows)
            differs = _or(differs, (tensor.index_select(0, index) != content).flatten(1).any(1))
            tensor.index_copy_(0, index, content)
        _note_changed(changed, group, differs)
    return changed


def _or(acc, differs):
    return differs if acc is None else acc | differs


def _note_changed(changed: dict[int, list[int]], group: LoadedGroup, differs) -> None:
    """Record the group's blocks whose bytes the fault changed: a stale source can hold the same
    content (the eval's one-token preflight of question 0 before question 0 itself; a shared
    few-shot prefix), and a block that did not change is no corruption to detect."""
    ids = [b for b, d in zip(group.block_ids, differs.tolist(), strict=True) if d]
    if ids:
        changed[group.group_index] = ids
