"""Every vLLM and NIXL internal the plugin's worker side touches, checked at start-up.

The plugin corrupts a decoder's freshly loaded KV (fault injection) and slows NIXL's progress
thread. Both reach into internals that change between versions, so they are named only here,
and :func:`check_worker_names` / :func:`missing_nixl_names` report every missing one at once.
Callers get pdcheck's own :class:`LoadedRequest` records, never vLLM types (only torch
tensors, which the in-place ops need).

Facts behind the hook (vLLM 0.32, /work/shared/notes/injection-points.md):
- `NixlBaseConnectorWorker.get_transfer_results()` runs in every worker (TP rank), on the
  thread that runs the forward, after each step. It pops `_recving_metadata[req_id]` for the
  receives that finished; failed receives are also in `finished_recving`.
- The next forward that reads a finished receive's KV is in a later `execute_model`, so an
  in-place change made in the hook always lands before the first read (on GPU, the ops are
  queued on the current stream, after the step just launched).
- `ReqMeta.local_block_ids` has one list per *transfer group* (not per kv_cache_group);
  attention groups must be indexed with `local_physical_block_ids` (kernel blocks), SSM
  groups with `local_block_ids` (one state block per request).
- Cache groups overlay one allocation: block b of a Mamba layer and block b of an attention
  layer are the same bytes, so each group's layers take only that group's ids.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import inspect
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from pdcheck._vllm.internals import vllm_version
from pdcheck.errors import VllmIncompatible

__all__ = [
    "LOAD_TOKENS_ATTR",
    "NIXL_API_MODULES",
    "LoadedGroup",
    "LoadedRequest",
    "check_worker_names",
    "install_receive_hook",
    "missing_nixl_names",
    "request_groups",
    "wrap_nixl_agent",
]

_NIXL_WORKER_MODULE = "vllm.distributed.kv_transfer.kv_connector.v1.nixl.base_worker"
_NIXL_METADATA_MODULE = "vllm.distributed.kv_transfer.kv_connector.v1.nixl.metadata"
_CONNECTOR_BASE_MODULE = "vllm.distributed.kv_transfer.kv_connector.v1.base"
_KV_CACHE_INTERFACE_MODULE = "vllm.v1.kv_cache_interface"
# Instance attributes of NixlBaseConnectorWorker the hook reads (set in __init__ or
# register_kv_caches, so checked in the class source rather than on the class).
_WORKER_ATTRS = (
    "_recving_metadata",
    "world_size",
    "kv_cache_layout",
    "device_kv_caches",
    "kv_cache_config",
    "_group_spec_types",
    "tp_rank",
)
# Methods the hook wraps, with the parameters vLLM calls them with.
_WORKER_METHODS = {"get_transfer_results": ["self"], "register_kv_caches": ["self", "kv_caches"]}
_WRAPPED_MARK = "_pdcheck_wrapped"
# Decoder: request id -> prompt tokens its KV holds once the load finishes, carried from the
# scheduler by the digest hooks (pdcheck._vllm.kv_digest_hooks) in the connector metadata and
# kept on the connector worker until the load finishes.
LOAD_TOKENS_ATTR = "pdcheck_load_tokens"

# The module that builds NIXL agents: nixl's top package re-exports one of these backends
# (`nixl/__init__.py` puts the real one in sys.modules["nixl._api"]).
NIXL_API_MODULES = ("nixl._api", "nixl_cu12._api", "nixl_cu13._api", "nixl_rocm._api")


@dataclass(frozen=True)
class LoadedGroup:
    """One transfer group of a finished receive: the ids to index its layers with, and those layers."""

    group_index: int
    is_state: bool  # a Mamba/GDN state group (one whole-state block); False: attention
    block_ids: tuple[int, ...]
    tensors: tuple[Any, ...]  # each layer's registered KV tensor (torch), blocks on dim 0


@dataclass(frozen=True)
class LoadedRequest:
    """A receive that finished without failure on one worker, before the model reads it."""

    request_id: str
    tp_rank: int
    groups: tuple[LoadedGroup, ...]
    # For KV digests: the prefiller's request id (the join key), the tokens it computed, both
    # sides' TP sizes, and the layout of the KV tensors.
    remote_request_id: str | None = None
    num_tokens: int | None = None
    tp_size: int = 1
    remote_tp_size: int = 1
    kv_cache_layout: str = ""
    # The prompt tokens the decoder takes this load to hold (the digest hooks carry it from its
    # scheduler); None without them.
    load_tokens: int | None = None


def check_worker_names() -> None:
    """Raise VllmIncompatible naming every internal the injection hook needs that this vLLM lacks."""
    missing: list[str] = []
    worker_cls = _attr(_NIXL_WORKER_MODULE, "NixlBaseConnectorWorker", missing)
    if worker_cls is not None:
        for name, params in _WORKER_METHODS.items():
            method = getattr(worker_cls, name, None)
            if method is None or list(inspect.signature(method).parameters) != params:
                missing.append(f"NixlBaseConnectorWorker.{name}({', '.join(params)})")
        try:
            source = inspect.getsource(worker_cls)
        except (OSError, TypeError):
            source = ""
        missing += [
            f"NixlBaseConnectorWorker.{a}" for a in _WORKER_ATTRS if f"self.{a}" not in source
        ]
    _fields(
        _NIXL_METADATA_MODULE,
        "ReqMeta",
        ("local_block_ids", "local_physical_block_ids", "remote", "tp_size"),
        missing,
    )
    _fields(_NIXL_METADATA_MODULE, "RemoteMeta", ("request_id", "num_tokens"), missing)
    _fields(
        _CONNECTOR_BASE_MODULE,
        "KVConnectorTransferResults",
        ("finished_recving", "failed_recving"),
        missing,
    )
    _fields(_KV_CACHE_INTERFACE_MODULE, "KVCacheGroupSpec", ("layer_names",), missing)
    config_cls = _attr(_KV_CACHE_INTERFACE_MODULE, "KVCacheConfig", missing)
    if config_cls is not None and not hasattr(config_cls, "transfer_groups"):
        missing.append("KVCacheConfig.transfer_groups")
    _attr(_KV_CACHE_INTERFACE_MODULE, "AttentionSpec", missing)
    _attr(_KV_CACHE_INTERFACE_MODULE, "MambaSpec", missing)
    if missing:
        raise VllmIncompatible(vllm_version(), list(dict.fromkeys(missing)))


def install_receive_hook(
    on_loaded: Callable[[list[LoadedRequest]], None],
    *,
    on_kv_caches_registered: Callable[[int], None],
) -> None:
    """Call `on_loaded` with every receive that just finished, in the worker, before any forward reads it.

    Wraps `NixlBaseConnectorWorker.get_transfer_results` at class level, so it must run before
    the connector is built (vLLM loads general plugins in the worker before that). Also calls
    `on_kv_caches_registered(tp_rank)` once a worker in this process has registered its KV
    caches with the hook in place: the proof that the hook is where the receives happen,
    whichever process (a `VllmWorker-*`, or `EngineCore` with CUDA's TP-1 `uni` executor)
    hosts the worker. Idempotent.
    """
    worker_cls = importlib.import_module(_NIXL_WORKER_MODULE).NixlBaseConnectorWorker
    original = worker_cls.get_transfer_results
    if getattr(original, _WRAPPED_MARK, False):
        return
    register_kv_caches = worker_cls.register_kv_caches

    @functools.wraps(register_kv_caches)
    def registered(self, kv_caches):
        result = register_kv_caches(self, kv_caches)
        on_kv_caches_registered(int(self.tp_rank))
        return result

    @functools.wraps(original)
    def get_transfer_results(self):
        # The original pops each finished request's metadata, so copy the dict first.
        pending = dict(self._recving_metadata)
        results = original(self)
        loaded = results.finished_recving - results.failed_recving
        if loaded:
            on_loaded(
                [
                    _loaded_request(self, rid, pending[rid])
                    for rid in sorted(loaded)
                    if rid in pending
                ]
            )
        return results

    setattr(get_transfer_results, _WRAPPED_MARK, True)
    worker_cls.get_transfer_results = get_transfer_results
    worker_cls.register_kv_caches = registered


def _loaded_request(worker: Any, request_id: str, meta: Any) -> LoadedRequest:
    remote = meta.remote
    return LoadedRequest(
        request_id=request_id,
        tp_rank=int(worker.tp_rank),
        groups=request_groups(worker, meta.local_block_ids, meta.local_physical_block_ids),
        remote_request_id=None if remote is None else str(remote.request_id),
        num_tokens=None if remote is None or remote.num_tokens is None else int(remote.num_tokens),
        tp_size=int(worker.world_size),
        remote_tp_size=int(meta.tp_size),
        kv_cache_layout=str(worker.kv_cache_layout),
        load_tokens=worker.__dict__.get(LOAD_TOKENS_ATTR, {}).pop(request_id, None),
    )


def request_groups(
    worker: Any, logical_ids: Sequence[Sequence[int]], physical_ids: Sequence[Sequence[int]]
) -> tuple[LoadedGroup, ...]:
    """A request's transfer groups on `worker`: attention groups indexed with kernel (physical)
    ids, state groups with logical ids (one state block per request), each with its own layers."""
    from vllm.v1.kv_cache_interface import AttentionSpec, MambaSpec

    groups = []
    for g, group in enumerate(worker.kv_cache_config.transfer_groups):
        spec_type = worker._group_spec_types[g]
        if issubclass(spec_type, MambaSpec):
            is_state, ids = True, logical_ids[g]
        elif issubclass(spec_type, AttentionSpec):
            is_state, ids = False, physical_ids[g]
        else:  # neither attention nor a state: nothing we know how to corrupt
            continue
        # Layers that share another layer's cache have no registered tensor of their own.
        tensors = tuple(
            worker.device_kv_caches[n] for n in group.layer_names if n in worker.device_kv_caches
        )
        groups.append(
            LoadedGroup(
                group_index=g,
                is_state=is_state,
                block_ids=tuple(int(b) for b in ids),
                tensors=tensors,
            )
        )
    return tuple(groups)


def missing_nixl_names(api_module: ModuleType) -> list[str]:
    """Names `wrap_nixl_agent` needs in a NIXL `_api` module that it lacks."""
    bind = getattr(api_module, "nixlBind", None)
    if bind is None:
        return [f"{api_module.__name__}.nixlBind"]
    missing = [f"nixlBind.{n}" for n in ("nixlAgent", "nixlAgentConfig") if not hasattr(bind, n)]
    if not missing and not hasattr(bind.nixlAgentConfig(), "pthrDelay"):
        missing.append("nixlBind.nixlAgentConfig.pthrDelay")
    return missing


def wrap_nixl_agent(api_module: ModuleType, *, pthr_delay_us: int) -> None:
    """Make every NIXL agent built through `api_module` use `pthr_delay_us` for its progress thread.

    `nixl_agent.__init__` hard-codes `pthrDelay = 0` on the config it passes to
    `nixlBind.nixlAgent(name, config)`, so the wrapper sets it on the way in. Idempotent.
    """
    bind = api_module.nixlBind
    original = bind.nixlAgent
    if getattr(original, _WRAPPED_MARK, False):
        return

    def nixl_agent(name, config, *args, **kwargs):
        config.pthrDelay = pthr_delay_us
        return original(name, config, *args, **kwargs)

    setattr(nixl_agent, _WRAPPED_MARK, True)
    bind.nixlAgent = nixl_agent


def _attr(module_name: str, name: str, missing: list[str]) -> Any:
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        missing.append(f"{module_name} ({exc})")
        return None
    value = getattr(module, name, None)
    if value is None:
        missing.append(f"{module_name}.{name}")
    return value


def _fields(module_name: str, cls_name: str, names: tuple[str, ...], missing: list[str]) -> None:
    cls = _attr(module_name, cls_name, missing)
    if cls is None:
        return
    present = {f.name for f in dataclasses.fields(cls)} if dataclasses.is_dataclass(cls) else set()
    missing += [f"{cls_name}.{n}" for n in names if n not in present]
