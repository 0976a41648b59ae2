"""Reading a live vLLM Scheduler into pdcheck's records: steps, block tables, KV groups, loads."""

from __future__ import annotations

from typing import Any

from pdcheck._vllm.internals import resolve
from pdcheck._vllm.records import GroupInfo, LoadStart, ScheduledRequest, StepRecord, TraceStep
from pdcheck._vllm.versions import block_copies


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


def block_tables(scheduler: Any, request_id: str) -> tuple[tuple[int, ...], ...]:
    managers = scheduler.kv_cache_manager.coordinator.single_type_managers
    return tuple(tuple(b.block_id for b in m.req_to_blocks.get(request_id, ())) for m in managers)


def group_infos(kv_cache_config: Any) -> tuple[GroupInfo, ...]:
    mamba_spec = resolve("vllm.v1.kv_cache_interface:MambaSpec")
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
                block_ids=block_tables(scheduler, request_id),
                samples=not request.is_prefill_chunk,
                incarnation=request.num_preemptions,
            )
        )
    copies = tuple((c.src_block_id, c.dst_block_id) for c in block_copies(output))
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


def capture_loads(connector: Any, pending: list[LoadStart]) -> None:
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
