"""Class-level patches of vLLM's Scheduler and KVCacheManager: the fix switches and the built hook.

Mutations (:mod:`pdcheck._vllm.mutations`) and trace hooks (:mod:`pdcheck._vllm.trace_hooks`)
patch through :func:`patched` too, so every patch nests and restores the same way.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator
from typing import Any

from pdcheck._vllm.internals import resolve


def scheduler_cls() -> type:
    return resolve("vllm.v1.core.sched.scheduler:Scheduler")


def kv_manager_cls() -> type:
    return resolve("vllm.v1.core.kv_cache_manager:KVCacheManager")


@contextlib.contextmanager
def patched(owner: type, attr: str, make: Callable[[Any], Any]) -> Iterator[None]:
    """Replace owner.attr with make(current) for the duration; nests and restores in order."""
    current = owner.__dict__[attr]
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
    cls: Any = scheduler_cls()
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

    return patched(scheduler_cls(), "__init__", make)


def patch_zeroing_fix_off() -> contextlib.AbstractContextManager[None]:
    """Connector-loaded blocks stay on the zero list, in the form this vLLM's fix has.

    ``skip-zeroing-group-ids`` (0.32.0 on): the groups ``allocate_slots`` is told to skip are
    ignored. ``skip-zero-block-ids`` (0.26.0-0.31.0): the scheduler's range query for the blocks a
    load will fill answers none, so nothing is taken off the zero list.
    """
    from pdcheck._vllm.versions import fix_form

    form = fix_form("zeroing")
    if form is not None and form.form == "skip-zero-block-ids":
        return patched(
            kv_manager_cls(), "get_zeroing_block_ids_in_range", lambda orig: _no_block_ids
        )
    return patch_skip_zeroing(lambda groups: ())


def _no_block_ids(self: Any, *args: Any, **kwargs: Any) -> list[int]:
    return []


def patch_skip_zeroing(
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

    return patched(kv_manager_cls(), "allocate_slots", make)
