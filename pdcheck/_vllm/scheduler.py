"""Adapter for the race harness, the fix switches and the trace recorder: every vLLM scheduler internal they touch.

Why one module: these names (``Scheduler._free_request_blocks``, ``req_to_blocks``,
``SchedulerOutput`` fields, ``KVCacheManager.allocate_slots``'s keywords) change between vLLM
versions. Everything outside this module sees only pdcheck's own records (:class:`StepRecord`,
:class:`ScheduledRequest`) and plain callables. :func:`check_internals` runs first and reports
every missing name at once, with the vLLM version (``VllmIncompatible``).

The two race fixes are *optional* internals: when a fix is absent (a vLLM from before it),
:func:`fixes_present` says so, the switches become no-ops, and the harness still runs.
Importing this module does not import vLLM; every function imports it where it is used.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import importlib
import inspect
import json
import logging
import tempfile
from collections.abc import Callable, Iterator
from typing import Any, NamedTuple

from pdcheck.errors import VllmIncompatible

logger = logging.getLogger(__name__)

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
    "vllm.v1.core.sched.scheduler:Scheduler._free_request_blocks",
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
# Internals that exist only when a fix is present (vLLM PR #45357 and PR #48481).
FIX_NAMES: dict[str, tuple[str, ...]] = {
    "block-reuse": (
        "vllm.v1.core.sched.scheduler:Scheduler._request_blocks_can_be_freed",
        "vllm.v1.core.sched.scheduler:Scheduler._drain_deferred_frees",
        "vllm.v1.core.kv_cache_manager:KVCacheManager.pop_blocks_for_free",
    ),
    "zeroing": (
        "vllm.v1.core.kv_cache_manager:KVCacheManager.allocate_slots(skip_zeroing_group_ids)",
        "vllm.v1.core.kv_cache_manager:KVCacheManager.record_blocks_for_zeroing",
    ),
}
SIM_CONNECTOR_CLASS = "PdcheckSimConsumerConnector"


def vllm_version() -> str:
    import vllm

    return getattr(vllm, "__version__", "unknown")


def _resolve(name: str) -> Any:
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


def _missing(names: tuple[str, ...]) -> list[str]:
    missing = []
    for name in names:
        try:
            _resolve(name)
        except LookupError:
            missing.append(name)
    return missing


@functools.cache
def check_internals() -> None:
    """Raise VllmIncompatible listing every required internal the installed vLLM lacks."""
    try:
        import vllm  # noqa: F401
    except ImportError as exc:
        raise VllmIncompatible(
            "not installed", missing=["vllm (install pdcheck[cpu] or pdcheck[gpu])"]
        ) from exc
    missing = _missing(REQUIRED_NAMES)
    if missing:
        raise VllmIncompatible(vllm_version(), missing=missing)


def quiet_vllm_logs() -> None:
    """The harness triggers load failures on purpose; vLLM's per-failure warnings would drown the summary."""
    logging.getLogger("vllm").setLevel(logging.CRITICAL)


@functools.cache
def fixes_present() -> dict[str, bool]:
    """Which race fixes the installed vLLM has; a fix whose internals are missing predates this vLLM."""
    return {fix: not _missing(names) for fix, names in FIX_NAMES.items()}


# --------------------------------------------------------------------------------------------
# Class-level patches: fix switches, mutations and trace hooks all go through here.

_ORIGINALS: dict[tuple[type, str], Any] = {}


def _scheduler_cls() -> type:
    return _resolve("vllm.v1.core.sched.scheduler:Scheduler")


def _kv_manager_cls() -> type:
    return _resolve("vllm.v1.core.kv_cache_manager:KVCacheManager")


@contextlib.contextmanager
def _patched(owner: type, attr: str, make: Callable[[Any], Any]) -> Iterator[None]:
    """Replace owner.attr with make(current) for the duration; nests and restores in order."""
    current = owner.__dict__[attr]
    _ORIGINALS.setdefault((owner, attr), current)
    setattr(owner, attr, make(current))
    try:
        yield
    finally:
        setattr(owner, attr, current)


def on_scheduler_built(callback: Callable[[bool], None]) -> None:
    """Call `callback(async_scheduling)` whenever this process builds a Scheduler (AsyncScheduler
    included), after its __init__ and any fix switch installed before this hook have run.

    The process that builds the scheduler is the one whose fix switches matter, whatever it is
    named; `async_scheduling` is the value vLLM resolved, which a platform may have forced off.
    Permanent and idempotent: a server keeps it for its lifetime.
    """
    cls = _scheduler_cls()
    current = cls.__dict__["__init__"]
    if getattr(current, _BUILT_HOOK_MARK, False):
        return

    @functools.wraps(current)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        current(self, *args, **kwargs)
        callback(bool(self.scheduler_config.async_scheduling))

    setattr(__init__, _BUILT_HOOK_MARK, True)
    cls.__init__ = __init__


_BUILT_HOOK_MARK = "_pdcheck_built_hook"


def patch_block_reuse_fix_off() -> contextlib.AbstractContextManager[None]:
    """New Scheduler instances free a request's blocks at once even with a step in flight."""

    def make(orig: Callable[..., None]) -> Callable[..., None]:
        @functools.wraps(orig)
        def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
            orig(self, *args, **kwargs)
            self.defer_block_free = False

        return __init__

    return _patched(_scheduler_cls(), "__init__", make)


def patch_zeroing_fix_off() -> contextlib.AbstractContextManager[None]:
    """Connector-loaded blocks stay on the zero list: ``skip_zeroing_group_ids`` is ignored."""
    return _patch_skip_zeroing(lambda groups: ())


def _patch_skip_zeroing(
    choose: Callable[[tuple[int, ...]], tuple[int, ...]],
) -> contextlib.AbstractContextManager[None]:
    def make(orig: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(orig)
        def allocate_slots(self: Any, *args: Any, **kwargs: Any) -> Any:
            kwargs["skip_zeroing_group_ids"] = tuple(
                choose(tuple(kwargs.get("skip_zeroing_group_ids", ())))
            )
            return orig(self, *args, **kwargs)

        return allocate_slots

    return _patched(_kv_manager_cls(), "allocate_slots", make)


# Mutations: small breakages of the fixes that real code could plausibly ship. Each must be caught.
def _mutation_free_fence_off_by_one() -> contextlib.AbstractContextManager[None]:
    return _patched(
        _scheduler_cls(),
        "_request_blocks_can_be_freed",
        lambda orig: (
            lambda self, request: (
                not self.defer_block_free or request.last_sched_seq <= self.processed_step_seq + 1
            )
        ),
    )


def _mutation_deferred_fence_one_early() -> contextlib.AbstractContextManager[None]:
    def make(orig: Callable[..., None]) -> Callable[..., None]:
        def _free_request_blocks(self: Any, request: Any) -> None:
            if self._request_blocks_can_be_freed(request):
                self.kv_cache_manager.free(request)
                return
            blocks = self.kv_cache_manager.pop_blocks_for_free(request)
            if blocks:
                self.deferred_frees.append((self.sched_step_seq - 1, blocks))

        return _free_request_blocks

    return _patched(_scheduler_cls(), "_free_request_blocks", make)


def _mutation_drain_before_processed() -> contextlib.AbstractContextManager[None]:
    def make(orig: Callable[..., None]) -> Callable[..., None]:
        def _drain_deferred_frees(self: Any) -> None:
            self.processed_step_seq += 1  # drain as if the step being processed were already done
            try:
                orig(self)
            finally:
                self.processed_step_seq -= 1

        return _drain_deferred_frees

    return _patched(_scheduler_cls(), "_drain_deferred_frees", make)


def _mutation_abort_frees_at_once() -> contextlib.AbstractContextManager[None]:
    def make(orig: Callable[..., Any]) -> Callable[..., Any]:
        def finish_requests(self: Any, *args: Any, **kwargs: Any) -> Any:
            saved, self.defer_block_free = self.defer_block_free, False
            try:
                return orig(self, *args, **kwargs)
            finally:
                self.defer_block_free = saved

        return finish_requests

    return _patched(_scheduler_cls(), "finish_requests", make)


def _mutation_no_rezero_after_failed_load() -> contextlib.AbstractContextManager[None]:
    return _patched(
        _kv_manager_cls(), "record_blocks_for_zeroing", lambda orig: lambda self, *a, **k: None
    )


MUTATIONS: dict[str, tuple[str, Callable[[], contextlib.AbstractContextManager[None]]]] = {
    "free-fence-off-by-one": (
        "frees blocks while the last step that wrote them is still in flight",
        _mutation_free_fence_off_by_one,
    ),
    "deferred-fence-one-early": (
        "queues deferred frees one step too early",
        _mutation_deferred_fence_one_early,
    ),
    "drain-before-processed": (
        "drains deferred frees before the step is counted processed",
        _mutation_drain_before_processed,
    ),
    "abort-frees-at-once": (
        "an abort from outside frees at once; only finishes seen in outputs defer",
        _mutation_abort_frees_at_once,
    ),
    "skip-zeroing-first-group-only": (
        "skip_zeroing covers only the first loaded KV group",
        lambda: _patch_skip_zeroing(lambda groups: groups[:1]),
    ),
    "no-rezero-after-failed-load": (
        "blocks left unwritten by a failed load are not zeroed again",
        _mutation_no_rezero_after_failed_load,
    ),
}


def apply_mutation(name: str) -> contextlib.AbstractContextManager[None]:
    return MUTATIONS[name][1]()


# --------------------------------------------------------------------------------------------
# pdcheck's own records: what one scheduled step means for the KV cache.


@dataclasses.dataclass(frozen=True, slots=True)
class GroupInfo:
    """One KV cache group as the checker sees it: attention token slots or one Mamba state per block."""

    kind: str  # "attention" | "mamba"
    block_size: int


@dataclasses.dataclass(frozen=True, slots=True)
class ScheduledRequest:
    """One request in a dispatched step: it writes tokens [start, start + num_tokens)."""

    request_id: str
    start: int
    num_tokens: int
    block_ids: tuple[tuple[int, ...], ...]  # per KV group, as the worker sees them for this step
    samples: bool  # False for a partial prefill chunk (its sampled token is discarded)
    incarnation: int  # the request's preemption count at dispatch


@dataclasses.dataclass(frozen=True, slots=True)
class LoadStart:
    """A connector load started by a step: tokens [start, end) land in block_ids."""

    request_id: str
    block_ids: tuple[tuple[int, ...], ...]
    start: int
    end: int


@dataclasses.dataclass(frozen=True, slots=True)
class StepRecord:
    """Everything a dispatched step does to KV memory; ``output`` is vLLM's SchedulerOutput, opaque here."""

    fence_seq: (
        int  # the scheduler's sched_step_seq after this step (0 when block freeing is not deferred)
    )
    requests: tuple[ScheduledRequest, ...]
    zero_block_ids: tuple[int, ...]
    block_copies: tuple[tuple[int, int], ...]
    loads: tuple[LoadStart, ...]
    finished_ids: tuple[str, ...]
    preempted_ids: tuple[str, ...]
    output: Any = dataclasses.field(repr=False, compare=False)

    @property
    def num_tokens(self) -> int:
        return sum(r.num_tokens for r in self.requests)


@dataclasses.dataclass(frozen=True, slots=True)
class FreeRecord:
    """A request's blocks leaving it: at once, or deferred behind a fence step."""

    request_id: str
    deferred: bool
    fence_seq: int


class TraceStep(NamedTuple):
    """A dispatched step as the trace records it: block ids as the worker receives them (deltas).

    Captured on the scheduler's thread as cheap copies of the SchedulerOutput's columns (C-level list
    and dict copies, no loop over the running requests, no sorting); :meth:`rows` and the recorder turn
    them into the trace's rows later, on the writer thread. Block id lists are copied because an
    in-process worker extends the lists of new and resumed requests in place. Built from the
    SchedulerOutput alone, so recording costs no walk over the block tables.
    """

    fence_seq: int
    new_rows: list[tuple[Any, ...]]  # (request id, start, num tokens, block ids per group, "new")
    counts: dict[str, int]  # request id -> tokens scheduled this step
    cached_ids: list[str]
    cached_starts: list[int]
    cached_blocks: list[Any]  # per cached request: blocks added per group, or None
    resumed: frozenset[str]
    zero_block_ids: tuple[int, ...]
    loads: tuple[LoadStart, ...]
    finished_ids: tuple[str, ...]  # set order; the recorder sorts
    preempted_ids: tuple[str, ...]

    def rows(self) -> list[tuple[Any, ...]]:
        """``(request id, start, num tokens, block ids per group or None, mode)`` per scheduled request.

        Mode "new" and "resumed" carry the whole table, "cached" only the blocks added this step.
        """
        counts, resumed = self.counts, self.resumed
        rows = list(self.new_rows)
        for request_id, start, blocks in zip(
            self.cached_ids, self.cached_starts, self.cached_blocks, strict=False
        ):
            rows.append(
                (
                    request_id,
                    start,
                    counts[request_id],
                    blocks,
                    "resumed" if request_id in resumed else "cached",
                )
            )
        return rows


def trace_step(scheduler: Any, output: Any, loads: tuple[LoadStart, ...]) -> TraceStep:
    counts = output.num_scheduled_tokens
    new_rows = [
        (
            new.req_id,
            new.num_computed_tokens,
            counts[new.req_id],
            tuple(map(tuple, new.block_ids)),
            "new",
        )
        for new in output.scheduled_new_reqs
    ]
    cached = output.scheduled_cached_reqs
    blocks = cached.new_block_ids
    # Most decode steps add no block to most requests: copy entry by entry only when some did.
    if blocks.count(None) == len(blocks):
        blocks = list(blocks)
    else:
        blocks = [None if b is None else tuple(map(tuple, b)) for b in blocks]
    resumed = cached.resumed_req_ids
    zero = output.new_block_ids_to_zero
    finished = output.finished_req_ids
    preempted = output.preempted_req_ids
    return TraceStep(
        getattr(scheduler, "sched_step_seq", 0),
        new_rows,
        dict(counts),
        list(cached.req_ids),
        list(cached.num_computed_tokens),
        blocks,
        frozenset(resumed) if resumed else frozenset(),
        tuple(zero) if zero else (),
        loads,
        tuple(finished) if finished else (),
        tuple(preempted) if preempted else (),
    )


def _tables(scheduler: Any, request_id: str) -> tuple[tuple[int, ...], ...]:
    managers = scheduler.kv_cache_manager.coordinator.single_type_managers
    return tuple(tuple(b.block_id for b in m.req_to_blocks.get(request_id, ())) for m in managers)


def group_infos(kv_cache_config: Any) -> tuple[GroupInfo, ...]:
    mamba_spec = _resolve("vllm.v1.kv_cache_interface:MambaSpec")
    return tuple(
        GroupInfo(
            "mamba" if isinstance(g.kv_cache_spec, mamba_spec) else "attention",
            g.kv_cache_spec.block_size,
        )
        for g in kv_cache_config.kv_cache_groups
    )


def describe_step(scheduler: Any, output: Any, loads: list[LoadStart]) -> StepRecord:
    """Translate a SchedulerOutput (after schedule() returned) into pdcheck's StepRecord."""
    requests = []
    for request_id, num_tokens in output.num_scheduled_tokens.items():
        request = scheduler.requests[request_id]
        requests.append(
            ScheduledRequest(
                request_id=request_id,
                start=request.num_computed_tokens - num_tokens,
                num_tokens=num_tokens,
                block_ids=_tables(scheduler, request_id),
                samples=not request.is_prefill_chunk,
                incarnation=request.num_preemptions,
            )
        )
    copies = tuple((c.src_block_id, c.dst_block_id) for c in (output.kv_cache_block_copies or ()))
    return StepRecord(
        fence_seq=getattr(scheduler, "sched_step_seq", 0),
        requests=tuple(requests),
        zero_block_ids=tuple(output.new_block_ids_to_zero or ()),
        block_copies=copies,
        loads=tuple(loads),
        finished_ids=tuple(sorted(output.finished_req_ids)),
        preempted_ids=tuple(sorted(output.preempted_req_ids or ())),
        output=output,
    )


# --------------------------------------------------------------------------------------------
# Trace hooks: the recorder gets pdcheck records, never vLLM objects.


@dataclasses.dataclass
class TraceSink:
    """Callbacks the trace hooks call, on the scheduler's thread; each gets pdcheck records or plain values.

    Every argument is a copy or immutable, so a sink may keep it and encode it later on another thread.
    """

    on_start: Callable[
        [tuple[GroupInfo, ...], bool, bool], None
    ]  # groups, defer_block_free, needs_zeroing
    on_step: Callable[[TraceStep], None]
    on_processed: Callable[
        [int, frozenset[str], frozenset[str], frozenset[int]], None
    ]  # num tokens, recving ok, failed, invalid
    on_free: Callable[[FreeRecord], None]


_NONE: frozenset[Any] = frozenset()


def _load_capturing(connector: Any, pending: list[LoadStart]) -> None:
    """Wrap one connector instance so that every async load it accepts is appended to ``pending``."""
    matched = connector.get_num_new_matched_tokens
    after_alloc = connector.update_state_after_alloc
    local_computed: dict[str, int] = {}  # request -> local prefix, only for async loads

    def get_num_new_matched_tokens(request: Any, num_computed_tokens: int) -> Any:
        result = matched(request, num_computed_tokens)
        # Only async loads race with the GPU stream; a synchronous load completes inside its step.
        if result[1]:
            local_computed[request.request_id] = num_computed_tokens
        return result

    def update_state_after_alloc(request: Any, blocks: Any, num_external_tokens: int) -> Any:
        if num_external_tokens > 0 and request.request_id in local_computed:
            start = local_computed.pop(request.request_id)
            ids = tuple(tuple(g) for g in blocks.get_block_ids())
            pending.append(LoadStart(request.request_id, ids, start, start + num_external_tokens))
        return after_alloc(request, blocks, num_external_tokens)

    connector.get_num_new_matched_tokens = get_num_new_matched_tokens
    connector.update_state_after_alloc = update_state_after_alloc


@contextlib.contextmanager
def trace_hooks(sink: TraceSink) -> Iterator[None]:
    """Hook every Scheduler built while active: steps, processed outputs, frees and connector loads."""
    cls = _scheduler_cls()

    def init(orig: Callable[..., None]) -> Callable[..., None]:
        @functools.wraps(orig)
        def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
            orig(self, *args, **kwargs)
            self._pdcheck_trace_loads = []
            if self.connector is not None:
                _load_capturing(self.connector, self._pdcheck_trace_loads)
            sink.on_start(
                group_infos(self.kv_cache_config),
                self.defer_block_free,
                self.needs_kv_cache_zeroing,
            )

        return __init__

    def schedule(orig: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(orig)
        def wrapped(self: Any, *args: Any, **kwargs: Any) -> Any:
            output = orig(self, *args, **kwargs)
            loads = getattr(self, "_pdcheck_trace_loads", None)
            taken: tuple[LoadStart, ...] = ()
            if loads:
                taken = tuple(loads)
                loads.clear()
            sink.on_step(trace_step(self, output, taken))
            return output

        return wrapped

    def update(orig: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(orig)
        def wrapped(self: Any, scheduler_output: Any, model_runner_output: Any) -> Any:
            kv = model_runner_output.kv_connector_output
            if kv is None:
                sink.on_processed(scheduler_output.total_num_scheduled_tokens, _NONE, _NONE, _NONE)
            else:
                failed = frozenset(kv.failed_recving or ())
                ok = frozenset(kv.finished_recving or ()) - failed
                sink.on_processed(
                    scheduler_output.total_num_scheduled_tokens,
                    ok,
                    failed,
                    frozenset(kv.invalid_block_ids or ()),
                )
            return orig(self, scheduler_output, model_runner_output)

        return wrapped

    def free(orig: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(orig)
        def wrapped(self: Any, request: Any) -> Any:
            can_free = getattr(self, "_request_blocks_can_be_freed", None)
            deferred = bool(can_free is not None and not can_free(request))
            sink.on_free(
                FreeRecord(request.request_id, deferred, getattr(self, "sched_step_seq", 0))
            )
            return orig(self, request)

        return wrapped

    with contextlib.ExitStack() as stack:
        stack.enter_context(_patched(cls, "__init__", init))
        stack.enter_context(_patched(cls, "schedule", schedule))
        stack.enter_context(_patched(cls, "update_from_output", update))
        stack.enter_context(_patched(cls, "_free_request_blocks", free))
        yield


@contextlib.contextmanager
def timing_scheduler_calls(add: Callable[[float, float], None]) -> Iterator[None]:
    """For the trace overhead benchmark: ``add(wall_s, thread_cpu_s)`` after every Scheduler.schedule and update_from_output.

    Enter it inside ``recording()`` so that the timed calls include the trace hooks.
    """
    import time

    cls = _scheduler_cls()

    def timed(orig: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(orig)
        def wrapped(self: Any, *args: Any, **kwargs: Any) -> Any:
            w, c = time.perf_counter(), time.thread_time()
            try:
                return orig(self, *args, **kwargs)
            finally:
                add(time.perf_counter() - w, time.thread_time() - c)

        return wrapped

    with _patched(cls, "schedule", timed), _patched(cls, "update_from_output", timed):
        yield


# --------------------------------------------------------------------------------------------
# Building the real scheduler in-process, the way EngineCore does, with a simulated consumer connector.


@dataclasses.dataclass(frozen=True)
class SchedulerSpec:
    """The scheduler to build: cache layout, sizes, queue depth and connector policy."""

    layout: str = "attention"  # "attention" | "hybrid"
    mamba_mode: str = (
        "align"  # hybrid only: "align" (prefix caching on) | "none" (prefix caching off)
    )
    num_mamba_groups: int = 1
    mamba_first: bool = True  # the real order for Granite-4.0-H and Qwen3.5
    zeroing: bool = False  # attention layout: mixed-precision cache, so new blocks are zeroed
    num_blocks: int = 48
    block_size: int = 16
    max_num_seqs: int = 8
    max_num_batched_tokens: int = 256
    max_model_len: int = 512
    prefix_caching: bool = True
    depth: int = 2  # batches in flight: 1 synchronous, 2 async scheduling, k pipeline parallel
    load_failure_policy: str = "recompute"  # "recompute" | "fail"
    # A connector that breaks the N-1 rule on hybrids (loads all N prompt tokens): a checker self-test.
    load_all_prompt_tokens: bool = False


_LLAMA = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 256,
    "intermediate_size": 512,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 64,
    "num_hidden_layers": 2,
    "vocab_size": 2048,
    "max_position_embeddings": 4096,
    "eos_token_id": 0,
    "dtype": "float32",
}
_GRANITE_HYBRID = {
    "architectures": ["GraniteMoeHybridForCausalLM"],
    "model_type": "granitemoehybrid",
    "hidden_size": 256,
    "intermediate_size": 512,
    "shared_intermediate_size": 512,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "num_hidden_layers": 4,
    "layer_types": ["linear_attention", "full_attention", "linear_attention", "full_attention"],
    "mamba_chunk_size": 256,
    "mamba_d_conv": 4,
    "mamba_d_head": 64,
    "mamba_d_state": 64,
    "mamba_expand": 2,
    "mamba_n_groups": 1,
    "mamba_n_heads": 8,
    "num_local_experts": 0,
    "num_experts_per_tok": 0,
    "position_embedding_type": "nope",
    "vocab_size": 2048,
    "max_position_embeddings": 4096,
    "eos_token_id": 0,
    "dtype": "float32",
}


@functools.cache
def _model_dir(layout: str) -> str:
    """A directory holding only a config.json: the scheduler needs the architecture, never weights."""
    path = tempfile.mkdtemp(prefix=f"pdcheck-race-{layout}-")
    with open(f"{path}/config.json", "w") as fh:
        json.dump(_GRANITE_HYBRID if layout == "hybrid" else _LLAMA, fh)
    return path


def _vllm_config(spec: SchedulerSpec) -> Any:
    from vllm.config import (
        CacheConfig,
        KVTransferConfig,
        ModelConfig,
        ParallelConfig,
        SchedulerConfig,
        VllmConfig,
    )

    model = ModelConfig(
        model=_model_dir(spec.layout),
        skip_tokenizer_init=True,
        max_model_len=spec.max_model_len,
        dtype="float32",
    )
    cache = CacheConfig(block_size=spec.block_size, enable_prefix_caching=spec.prefix_caching)
    sched = SchedulerConfig(
        max_num_seqs=spec.max_num_seqs,
        max_num_batched_tokens=spec.max_num_batched_tokens,
        max_model_len=spec.max_model_len,
        is_encoder_decoder=False,
        enable_chunked_prefill=True,
    )
    transfer = KVTransferConfig(
        kv_connector=SIM_CONNECTOR_CLASS,
        kv_connector_module_path=__name__,
        kv_role="kv_consumer",
        kv_load_failure_policy=spec.load_failure_policy,
        kv_connector_extra_config={"load_all_prompt_tokens": spec.load_all_prompt_tokens},
    )
    config = VllmConfig(
        model_config=model,
        cache_config=cache,
        scheduler_config=sched,
        kv_transfer_config=transfer,
        parallel_config=ParallelConfig(),
    )
    # The CPU platform turns async scheduling off while VllmConfig is built; a server with a
    # GPU keeps it. Setting it afterwards gives max_concurrent_batches == 2, as on a GPU.
    config.scheduler_config.async_scheduling = spec.depth > 1
    config.cache_config.num_gpu_blocks = spec.num_blocks
    if spec.depth > 2:
        config.parallel_config.pipeline_parallel_size = spec.depth
        config.scheduler_config.async_scheduling = False
    return config


def _kv_cache_config(spec: SchedulerSpec, config: Any) -> Any:
    import torch
    from vllm.v1.kv_cache_interface import (
        FullAttentionSpec,
        KVCacheConfig,
        KVCacheGroupSpec,
        MambaSpec,
    )

    attention = KVCacheGroupSpec(
        ["model.layers.1.self_attn.attn"],
        FullAttentionSpec(
            block_size=spec.block_size, num_kv_heads=2, head_size=64, dtype=torch.float32
        ),
    )
    groups = [attention]
    if spec.layout == "hybrid":
        mode = config.cache_config.mamba_cache_mode
        mamba_bs = config.cache_config.mamba_block_size
        mambas = [
            KVCacheGroupSpec(
                [f"model.layers.{2 * i}.mixer"],
                MambaSpec(
                    block_size=mamba_bs,
                    shapes=((3, 64), (8, 64, 64)),
                    dtypes=(torch.float32, torch.float32),
                    mamba_cache_mode=mode,
                ),
            )
            for i in range(spec.num_mamba_groups)
        ]
        groups = mambas + groups if spec.mamba_first else groups + mambas
    cls = KVCacheConfig
    if spec.zeroing and spec.layout == "attention":
        cls = _zeroing_kv_cache_config_cls()
    return cls(num_blocks=spec.num_blocks, kv_cache_tensors=[], kv_cache_groups=groups)


@functools.cache
def _zeroing_kv_cache_config_cls() -> type:
    """A KVCacheConfig that asks for zeroing, as a mixed-precision cache does."""
    from vllm.v1.kv_cache_interface import KVCacheConfig

    return type(
        "ZeroingKVCacheConfig",
        (KVCacheConfig,),
        {"needs_kv_cache_zeroing": property(lambda self: True)},
    )


@functools.cache
def _sim_connector_cls() -> type:
    from vllm.distributed.kv_transfer.kv_connector.v1.base import (
        KVConnectorBase_V1,
        KVConnectorMetadata,
        SupportsHMA,
    )

    class PdcheckSimConsumerConnector(KVConnectorBase_V1, SupportsHMA):
        """A PD consumer: remote requests load their prompt (N-1 tokens for hybrids) asynchronously."""

        def __init__(self, vllm_config: Any, role: Any, kv_cache_config: Any = None) -> None:
            super().__init__(vllm_config, role, kv_cache_config)
            self.remote: set[str] = set()
            # The N-1 rule (NIXL's _prefill_backoff): a hybrid decoder loads h(N-1) and computes token N-1.
            hybrid = any(i.kind == "mamba" for i in group_infos(kv_cache_config))
            load_all = vllm_config.kv_transfer_config.kv_connector_extra_config.get(
                "load_all_prompt_tokens", False
            )
            self.backoff = 1 if hybrid and not load_all else 0

        def get_num_new_matched_tokens(
            self, request: Any, num_computed_tokens: int
        ) -> tuple[int, bool]:
            if request.request_id not in self.remote:
                return 0, False
            num = request.num_prompt_tokens - self.backoff - num_computed_tokens
            return (num, True) if num > 0 else (0, False)

        def update_state_after_alloc(
            self, request: Any, blocks: Any, num_external_tokens: int
        ) -> None:
            if num_external_tokens > 0:
                self.remote.discard(
                    request.request_id
                )  # one load per request, as a prefiller sends once

        def get_loaded_kv_cache_group_ids(self, request: Any) -> tuple[int, ...]:
            return self._kv_cache_config.transfer_group_ids

        def build_connector_meta(self, scheduler_output: Any) -> Any:
            return KVConnectorMetadata()

        def request_finished(self, request: Any, block_ids: Any) -> tuple[bool, None]:
            return False, None

        def request_finished_all_groups(self, request: Any, block_ids: Any) -> tuple[bool, None]:
            return False, None

        # Worker-side methods: the simulated executor never calls them.
        def start_load_kv(self, forward_context: Any, **kwargs: Any) -> None: ...
        def wait_for_layer_load(self, layer_name: str) -> None: ...
        def save_kv_layer(
            self, layer_name: str, kv_layer: Any, attn_metadata: Any, **kwargs: Any
        ) -> None: ...
        def wait_for_save(self) -> None: ...

    return PdcheckSimConsumerConnector


def __getattr__(name: str) -> Any:
    # vLLM's connector factory does getattr(module, kv_connector); building the class lazily keeps
    # this module importable without vLLM.
    if name == SIM_CONNECTOR_CLASS:
        return _sim_connector_cls()
    raise AttributeError(name)


class SimScheduler:
    """The real vLLM scheduler (Scheduler or AsyncScheduler) and KV cache manager, driven step by step.

    Built like EngineCore builds it; the harness calls schedule() to dispatch a step and update()
    with the simulated executor's output for the oldest step in flight.
    """

    def __init__(self, spec: SchedulerSpec) -> None:
        check_internals()
        from vllm.sampling_params import SamplingParams
        from vllm.utils.hashing import get_hash_fn_by_name
        from vllm.v1.core.kv_cache_utils import (
            get_request_block_hasher,
            init_none_hash,
            resolve_kv_cache_block_sizes,
        )
        from vllm.v1.outputs import KVConnectorOutput, ModelRunnerOutput
        from vllm.v1.request import Request, RequestStatus
        from vllm.v1.structured_output import StructuredOutputManager

        self.spec = spec
        config = _vllm_config(spec)
        kv_config = _kv_cache_config(spec, config)
        sched_bs, hash_bs = resolve_kv_cache_block_sizes(kv_config, config)
        hash_fn = get_hash_fn_by_name(config.cache_config.prefix_caching_hash_algo)
        init_none_hash(hash_fn)
        self._hasher = get_request_block_hasher(hash_bs, hash_fn)
        cls = config.scheduler_config.get_scheduler_cls()
        self._scheduler = cls(
            vllm_config=config,
            kv_cache_config=kv_config,
            structured_output_manager=StructuredOutputManager(config),
            block_size=sched_bs,
            hash_block_size=hash_bs,
        )
        self.groups = group_infos(kv_config)
        self.needs_zeroing = bool(kv_config.needs_kv_cache_zeroing)
        self._connector = self._scheduler.connector
        self._loads: list[LoadStart] = []
        _load_capturing(self._connector, self._loads)
        self._SamplingParams = SamplingParams
        self._Request = Request
        self._aborted = RequestStatus.FINISHED_ABORTED
        self._ModelRunnerOutput = ModelRunnerOutput
        self._KVConnectorOutput = KVConnectorOutput

    @property
    def defer_block_free(self) -> bool:
        return bool(getattr(self._scheduler, "defer_block_free", False))

    @property
    def scheduler_class(self) -> str:
        return type(self._scheduler).__name__

    def add_request(
        self,
        request_id: str,
        prompt: list[int],
        *,
        max_tokens: int,
        eos_token_id: int,
        remote: bool,
    ) -> None:
        params = self._SamplingParams(max_tokens=max_tokens, temperature=0.0)
        params.update_from_generation_config({}, eos_token_id=eos_token_id)
        request = self._Request(request_id, prompt, params, None, block_hasher=self._hasher)
        if remote:
            self._connector.remote.add(request_id)
        self._scheduler.add_request(request)

    def has_requests(self) -> bool:
        return bool(self._scheduler.has_requests())

    def schedule(self) -> StepRecord:
        output = self._scheduler.schedule()
        loads = list(self._loads)
        self._loads.clear()
        return describe_step(self._scheduler, output, loads)

    def update(
        self,
        step: StepRecord,
        sampled: dict[str, list[int]],
        *,
        finished_recving: set[str],
        failed_recving: set[str],
        invalid_block_ids: set[int],
    ) -> list[tuple[str, str]]:
        """Process the executor output of ``step``; returns (request id, finish reason) for finished requests."""
        req_ids = [r.request_id for r in step.requests]
        kv_output = None
        if finished_recving or failed_recving or invalid_block_ids:
            kv_output = self._KVConnectorOutput(
                finished_recving=finished_recving | failed_recving,
                failed_recving=failed_recving,
                invalid_block_ids=invalid_block_ids,
            )
        output = self._ModelRunnerOutput(
            req_ids=req_ids,
            req_id_to_index={rid: i for i, rid in enumerate(req_ids)},
            sampled_token_ids=[sampled.get(rid, []) for rid in req_ids],
            kv_connector_output=kv_output,
        )
        engine_outputs = self._scheduler.update_from_output(step.output, output)
        finished = []
        for outs in engine_outputs.values():
            for out in outs.outputs:
                if out.finish_reason is not None:
                    finished.append((out.request_id, str(out.finish_reason)))
        return finished

    def abort(self, request_id: str) -> bool:
        return bool(self._scheduler.finish_requests(request_id, self._aborted))

    def is_live(self, request_id: str, incarnation: int) -> bool:
        """True while the request is unfinished and not preempted since the step that saw ``incarnation``."""
        request = self._scheduler.requests.get(request_id)
        return (
            request is not None
            and not request.is_finished()
            and request.num_preemptions == incarnation
        )

    def is_loading(self, request_id: str) -> bool:
        request = self._scheduler.requests.get(request_id)
        return request is not None and request.status.name == "WAITING_FOR_REMOTE_KVS"

    def num_free_blocks(self) -> int:
        return int(self._scheduler.kv_cache_manager.block_pool.get_num_free_blocks())

    def block_ids(self, request_id: str) -> tuple[tuple[int, ...], ...]:
        return _tables(self._scheduler, request_id)

    def owners(self) -> dict[int, list[str]]:
        """Block id -> requests whose block tables hold it now (null block excluded)."""
        result: dict[int, list[str]] = {}
        for request_id in self._scheduler.requests:
            for table in _tables(self._scheduler, request_id):
                for block in table:
                    if block:
                        result.setdefault(block, []).append(request_id)
        return result
