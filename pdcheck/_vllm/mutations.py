"""Mutations: small breakages of the race fixes that real code could plausibly ship.

``pdcheck race --mutation NAME`` runs the harness with one applied; the checker must catch
each one.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable
from typing import Any

from pdcheck._vllm.internals import missing_names, vllm_version
from pdcheck._vllm.patches import kv_manager_cls, patch_skip_zeroing, patched, scheduler_cls
from pdcheck._vllm.versions import KV_MANAGER, SCHEDULER
from pdcheck.errors import VllmIncompatible


def _mutation_free_fence_off_by_one() -> contextlib.AbstractContextManager[None]:
    return patched(
        scheduler_cls(),
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

    return patched(scheduler_cls(), "_free_request_blocks", make)


def _mutation_drain_before_processed() -> contextlib.AbstractContextManager[None]:
    def make(orig: Callable[..., None]) -> Callable[..., None]:
        def _drain_deferred_frees(self: Any) -> None:
            self.processed_step_seq += 1  # drain as if the step being processed were already done
            try:
                orig(self)
            finally:
                self.processed_step_seq -= 1

        return _drain_deferred_frees

    return patched(scheduler_cls(), "_drain_deferred_frees", make)


def _mutation_abort_frees_at_once() -> contextlib.AbstractContextManager[None]:
    def make(orig: Callable[..., Any]) -> Callable[..., Any]:
        def finish_requests(self: Any, *args: Any, **kwargs: Any) -> Any:
            saved, self.defer_block_free = self.defer_block_free, False
            try:
                return orig(self, *args, **kwargs)
            finally:
                self.defer_block_free = saved

        return finish_requests

    return patched(scheduler_cls(), "finish_requests", make)


def _mutation_no_rezero_after_failed_load() -> contextlib.AbstractContextManager[None]:
    return patched(
        kv_manager_cls(), "record_blocks_for_zeroing", lambda orig: lambda self, *a, **k: None
    )


@dataclasses.dataclass(frozen=True)
class Mutation:
    description: str
    apply: Callable[[], contextlib.AbstractContextManager[None]]
    # The vLLM names the mutation rewrites: a release without them has another form of the fix.
    names: tuple[str, ...]


MUTATIONS: dict[str, Mutation] = {
    "free-fence-off-by-one": Mutation(
        "frees blocks while the last step that wrote them is still in flight",
        _mutation_free_fence_off_by_one,
        (f"{SCHEDULER}._request_blocks_can_be_freed",),
    ),
    "deferred-fence-one-early": Mutation(
        "queues deferred frees one step too early",
        _mutation_deferred_fence_one_early,
        (f"{SCHEDULER}._request_blocks_can_be_freed", f"{SCHEDULER}._free_request_blocks"),
    ),
    "drain-before-processed": Mutation(
        "drains deferred frees before the step is counted processed",
        _mutation_drain_before_processed,
        (f"{SCHEDULER}._drain_deferred_frees",),
    ),
    "abort-frees-at-once": Mutation(
        "an abort from outside frees at once; only finishes seen in outputs defer",
        _mutation_abort_frees_at_once,
        (f"{SCHEDULER}._drain_deferred_frees",),
    ),
    "skip-zeroing-first-group-only": Mutation(
        "skip_zeroing covers only the first loaded KV group",
        lambda: patch_skip_zeroing(lambda groups: groups[:1]),
        (f"{KV_MANAGER}.allocate_slots(skip_zeroing_group_ids)",),
    ),
    "no-rezero-after-failed-load": Mutation(
        "blocks left unwritten by a failed load are not zeroed again",
        _mutation_no_rezero_after_failed_load,
        (f"{KV_MANAGER}.record_blocks_for_zeroing",),
    ),
}


def apply_mutation(name: str) -> contextlib.AbstractContextManager[None]:
    """Apply one mutation; a vLLM whose fix has another form (or none) is refused, naming it."""
    mutation = MUTATIONS[name]
    missing = missing_names(mutation.names)
    if missing:
        raise VllmIncompatible(
            vllm_version(),
            missing,
            reason=f"mutation {name} rewrites {', '.join(missing)}, which this vLLM does not have "
            "(its fix has another form, or none)",
        )
    return mutation.apply()
