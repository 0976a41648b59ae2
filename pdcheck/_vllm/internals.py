"""The start-up check: every vLLM internal the race harness, fix switches and trace hooks name.

These names (``req_to_blocks``, ``SchedulerOutput`` fields, ``KVCacheManager.allocate_slots``'s
keywords) change between vLLM versions. :func:`check_internals` runs first: a release older than
the supported range is refused in one line, an import that fails is named as an import error,
and every missing name is reported at once, with the vLLM version (``VllmIncompatible``).

The two race fixes are *optional* internals, identified by form (:mod:`pdcheck._vllm.versions`):
a name that a fix added is never required, so the harness runs on the releases that had the race.
Importing this module, or any module of this package, does not import vLLM; every function
imports it where it is used.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import logging
from typing import Any

from pdcheck.errors import VllmIncompatible

# "module:attribute[.attribute]" names the harness cannot run without.
REQUIRED_NAMES: tuple[str, ...] = (
    "vllm.config:VllmConfig",
    "vllm.config:ModelConfig",
    "vllm.config:CacheConfig",
    "vllm.config:SchedulerConfig",
    "vllm.config:KVTransferConfig",
    "vllm.sampling_params:SamplingParams",
    "vllm.v1.core.sched.scheduler:Scheduler.schedule",
    "vllm.v1.core.sched.scheduler:Scheduler.update_from_output",
    "vllm.v1.core.sched.scheduler:Scheduler.finish_requests",
    "vllm.v1.core.sched.scheduler:Scheduler.add_request",
    "vllm.v1.core.sched.scheduler:Scheduler._preempt_request",
    "vllm.v1.core.sched.async_scheduler:AsyncScheduler",
    "vllm.v1.core.kv_cache_manager:KVCacheManager.allocate_slots",
    "vllm.v1.core.kv_cache_utils:resolve_kv_cache_block_sizes",
    "vllm.v1.core.kv_cache_utils:get_request_block_hasher",
    "vllm.v1.core.kv_cache_utils:init_none_hash",
    "vllm.v1.kv_cache_interface:KVCacheConfig",
    "vllm.v1.kv_cache_interface:KVCacheGroupSpec",
    "vllm.v1.kv_cache_interface:FullAttentionSpec",
    "vllm.v1.kv_cache_interface:MambaSpec",
    "vllm.v1.outputs:ModelRunnerOutput",
    "vllm.v1.outputs:KVConnectorOutput",
    "vllm.v1.request:Request",
    "vllm.v1.request:RequestStatus",
    "vllm.utils.hashing:get_hash_fn_by_name",
    "vllm.distributed.kv_transfer.kv_connector.v1.base:KVConnectorBase_V1",
    "vllm.distributed.kv_transfer.kv_connector.v1.base:KVConnectorMetadata",
    "vllm.distributed.kv_transfer.kv_connector.v1.base:SupportsHMA",
)


def vllm_version() -> str:
    import vllm

    return getattr(vllm, "__version__", "unknown")


def resolve(name: str) -> Any:
    """Resolve "module:attr.attr(keyword)"; raises LookupError when any part is missing."""
    module_name, _, path = name.partition(":")
    keyword = None
    if path.endswith(")"):
        path, _, keyword = path[:-1].partition("(")
    try:
        obj: Any = importlib.import_module(module_name)
    except ImportError as exc:
        raise LookupError(name) from exc
    for part in path.split("."):
        if not hasattr(obj, part):
            raise LookupError(name)
        obj = getattr(obj, part)
    if keyword and keyword not in inspect.signature(obj).parameters:
        raise LookupError(name)
    return obj


def missing_names(names: tuple[str, ...]) -> list[str]:
    missing = []
    for name in names:
        try:
            resolve(name)
        except LookupError:
            missing.append(name)
    return missing


@functools.cache
def check_internals() -> None:
    """Raise VllmIncompatible for a release older than the supported range, a vLLM module that
    does not import (named with its error), or required internals the installed vLLM lacks."""
    from pdcheck._vllm.versions import is_older_than_supported, supported_range

    try:
        import vllm  # noqa: F401
    except ImportError as exc:
        raise VllmIncompatible(
            "not installed", missing=["vllm (install pdcheck[cpu] or pdcheck[gpu])"]
        ) from exc
    version = vllm_version()
    if is_older_than_supported(version):
        raise VllmIncompatible(version, [], reason=f"pdcheck supports vLLM {supported_range()}")
    for module in dict.fromkeys(name.partition(":")[0] for name in REQUIRED_NAMES):
        try:
            importlib.import_module(module)
        except ImportError as exc:
            raise VllmIncompatible(
                version, [], reason=f"importing {module} failed: {type(exc).__name__}: {exc}"
            ) from exc
    missing = missing_names(REQUIRED_NAMES)
    if missing:
        raise VllmIncompatible(version, missing=missing)


def quiet_vllm_logs() -> None:
    """The harness triggers load failures on purpose; vLLM's per-failure warnings would drown the summary."""
    logging.getLogger("vllm").setLevel(logging.CRITICAL)


def fixes_present() -> dict[str, bool]:
    """Which race fixes the installed vLLM has, in any of their forms."""
    from pdcheck._vllm.versions import fix_statuses

    return {fix: status.state == "present" for fix, status in fix_statuses().items()}


# What the KV-digest hooks (pdcheck._vllm.kv_digest_hooks) name, beside the injection hook's
# worker names (pdcheck._vllm.worker); checked when PDCHECK_KV_DIGEST is set.
DIGEST_NAMES: tuple[str, ...] = (
    "vllm.distributed.kv_transfer.kv_connector.v1.nixl.pull_scheduler:NixlPullConnectorScheduler.request_finished",
    "vllm.distributed.kv_transfer.kv_connector.v1.nixl.pull_scheduler:NixlPullConnectorScheduler.build_connector_meta",
    "vllm.distributed.kv_transfer.kv_connector.v1.nixl.pull_scheduler:NixlPullConnectorScheduler.get_num_new_matched_tokens",
    "vllm.distributed.kv_transfer.kv_connector.v1.nixl.connector:NixlPullConnector.bind_connector_metadata",
    "vllm.distributed.kv_transfer.kv_connector.v1.nixl.base_worker:NixlBaseConnectorWorker._logical_to_kernel_block_ids",
)
# What the digest hooks read a prefilled request's own block table through (per transfer group),
# to say which token range each advertised block holds. Optional: a release without it still
# gets digests, of the advertised blocks, and the analysis says block order went unchecked.
DIGEST_TABLE_NAMES: tuple[str, ...] = (
    "vllm.v1.kv_cache_interface:KVCacheConfig.select_transfer_block_ids",
)

_NIXL = "vllm.distributed.kv_transfer.kv_connector.v1.nixl"
# What each serving mutant (pdcheck._vllm.serving_mutants) replaces; checked when PDCHECK_MUTANT is set.
SERVING_MUTANT_NAMES: dict[str, tuple[str, ...]] = {
    "early-free": (f"{_NIXL}.pull_scheduler:NixlPullConnectorScheduler.request_finished",),
    "short-block-count": (f"{_NIXL}.pull_worker:NixlPullConnectorWorker._read_blocks",),
    "boundary-short-read": (f"{_NIXL}.pull_worker:NixlPullConnectorWorker._read_blocks",),
    "hybrid-guard-inverted": (
        f"{_NIXL}.base_scheduler:NixlBaseConnectorScheduler._truncate_request_for_prefill",
        f"{_NIXL}.base_scheduler:NixlBaseConnectorScheduler._prefill_backoff",
    ),
    "load-finished-early": (f"{_NIXL}.pull_worker:NixlPullConnectorWorker._read_blocks",),
    "prefix-hit-wrong-end": (f"{_NIXL}.base_worker:NixlBaseConnectorWorker._apply_prefix_caching",),
    "advertised-order-swapped": (
        f"{_NIXL}.base_scheduler:NixlBaseConnectorScheduler.get_exchange_clipped_blocks",
        f"{_NIXL}.pull_scheduler:NixlPullConnectorScheduler.request_finished",
    ),
}
# What the clean-stop order (pdcheck._vllm.clean_stop) wraps: the same in 0.22.0 through 0.32.0.
CLEAN_STOP_NAMES: tuple[str, ...] = ("vllm.v1.engine.async_llm:AsyncLLM.shutdown",)
# What the late-landing amplifier (pdcheck._vllm.land_delay) wraps; checked when
# PDCHECK_KV_LAND_DELAY_MS is set.
LAND_DELAY_NAMES: tuple[str, ...] = (
    f"{_NIXL}.pull_worker:NixlPullConnectorWorker._read_blocks",
    f"{_NIXL}.base_worker:NixlBaseConnectorWorker.get_transfer_results",
    f"{_NIXL}.tp_mapping:ReadSpec",
)


def check_names(names: tuple[str, ...]) -> None:
    """Raise VllmIncompatible listing every one of `names` this vLLM lacks."""
    missing = missing_names(names)
    if missing:
        raise VllmIncompatible(vllm_version(), missing)
