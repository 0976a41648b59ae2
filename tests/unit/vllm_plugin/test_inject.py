"""The injector corrupts exactly the selected requests' loaded blocks, group by group, and logs them.

Plain torch tensors stand in for a worker's registered KV cache (blocks on dim 0); no vLLM.
"""

from __future__ import annotations

import json

import pytest
import torch

from pdcheck._vllm.worker import LoadedGroup, LoadedRequest
from pdcheck.vllm_plugin.inject import Injector
from pdcheck.vllm_plugin.marker import InjectionLog
from pdcheck.vllm_plugin.selection import is_selected
from pdcheck.vllm_plugin.settings import InjectKind, InjectSpec

N_BLOCKS = 16


def _cache():
    """An overlaid hybrid cache: one buffer seen as an attention layer and a state layer."""
    backing = torch.arange(N_BLOCKS * 8, dtype=torch.float32).reshape(N_BLOCKS, 8) + 1.0  # no zeros
    attention = backing.view(N_BLOCKS, 2, 4)
    state = backing.view(N_BLOCKS, 8)
    return backing, attention, state


def _request(rid, attention, state, attn_ids, state_ids, tp_rank=0):
    return LoadedRequest(
        request_id=rid,
        tp_rank=tp_rank,
        groups=(
            LoadedGroup(group_index=0, is_state=True, block_ids=tuple(state_ids), tensors=(state,)),
            LoadedGroup(
                group_index=1, is_state=False, block_ids=tuple(attn_ids), tensors=(attention,)
            ),
        ),
    )


def _lines(tmp_path):
    path = tmp_path / "injections.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def _first_ids(fraction, seed, selected, n):
    ids = [f"pd-c1-r0-q{i:05d}" for i in range(1000)]
    return [i for i in ids if is_selected(i, fraction=fraction, seed=seed) == selected][:n]


def test_zero_mode_zeroes_only_selected_attention_blocks(tmp_path):
    """Selected: its attention blocks become zero; its state block and every other block are unchanged."""
    backing, attention, state = _cache()
    before = backing.clone()
    (picked,) = _first_ids(0.5, 7, True, 1)
    (skipped,) = _first_ids(0.5, 7, False, 1)
    injector = Injector(InjectSpec(InjectKind.ZERO_LOADED_KV, 0.5, 7), InjectionLog(tmp_path))
    injector.on_loaded(
        [
            _request(f"cmpl-{picked}-0-aaaaaaaa", attention, state, attn_ids=[2, 3], state_ids=[9]),
            _request(
                f"cmpl-{skipped}-0-bbbbbbbb", attention, state, attn_ids=[4, 5], state_ids=[10]
            ),
        ]
    )
    assert torch.count_nonzero(backing[[2, 3]]) == 0
    untouched = [b for b in range(N_BLOCKS) if b not in (2, 3)]
    assert torch.equal(backing[untouched], before[untouched])
    (line,) = _lines(tmp_path)
    assert line["x_request_id"] == picked and line["request_id"] == f"cmpl-{picked}-0-aaaaaaaa"
    assert (line["kind"], line["fraction"], line["seed"], line["blocks"]) == (
        "zero-loaded-kv",
        0.5,
        7,
        [[], [2, 3]],
    )
    assert line["tp_rank"] == 0 and line["pid"] > 0


def test_group_ids_index_only_their_own_layers(tmp_path):
    """Block 5 of the state group and block 5 of the attention group are the same bytes: zeroing
    attention block 2 must not touch state block 2's view through another id (overlay pitfall)."""
    backing, attention, state = _cache()
    before = backing.clone()
    injector = Injector(InjectSpec(InjectKind.ZERO_LOADED_KV, 1.0, 0), InjectionLog(tmp_path))
    injector.on_loaded(
        [_request("cmpl-q-0-aaaaaaaa", attention, state, attn_ids=[2], state_ids=[5])]
    )
    assert torch.count_nonzero(backing[2]) == 0
    assert torch.equal(backing[5], before[5])


def test_selection_is_the_same_in_any_order_and_batching(tmp_path):
    """Concurrency changes order and batching of receives, never which requests are injected."""
    ids = [f"pd-c8-r0-q{i:05d}" for i in range(40)]
    runs = []
    for order, batch in ((ids, 1), (list(reversed(ids)), 8), (ids[1::2] + ids[::2], 5)):
        _, attention, state = _cache()
        log_dir = tmp_path / f"run{len(runs)}"
        injector = Injector(InjectSpec(InjectKind.ZERO_LOADED_KV, 0.5, 3), InjectionLog(log_dir))
        reqs = [
            _request(f"cmpl-{i}-0-{n:08x}", attention, state, [1], [2]) for n, i in enumerate(order)
        ]
        for k in range(0, len(reqs), batch):
            injector.on_loaded(reqs[k : k + batch])
        runs.append({line["x_request_id"] for line in _lines(log_dir)})
    assert runs[0] == runs[1] == runs[2] == {i for i in ids if is_selected(i, fraction=0.5, seed=3)}
    assert 10 < len(runs[0]) < 30


def test_stale_mode_writes_the_previous_receives_content(tmp_path):
    """Stale: each loaded block (attention and state) gets the previous receive's blocks as they were
    loaded (cycled when fewer); the first receive has no source and is not injected or logged."""
    backing, attention, state = _cache()
    original = backing.clone()
    injector = Injector(InjectSpec(InjectKind.STALE_KV, 1.0, 0), InjectionLog(tmp_path))
    injector.on_loaded(
        [_request("cmpl-a-0-aaaaaaaa", attention, state, attn_ids=[1, 2], state_ids=[3])]
    )
    assert torch.equal(backing, original)
    # Change the first request's blocks after its receive: the snapshot must be a copy.
    backing[[1, 2, 3]] = -1.0
    injector.on_loaded(
        [_request("cmpl-b-0-bbbbbbbb", attention, state, attn_ids=[6, 7, 8], state_ids=[9])]
    )
    assert torch.equal(backing[6], original[1]) and torch.equal(backing[7], original[2])
    assert torch.equal(backing[8], original[1])  # cycled
    assert torch.equal(backing[9], original[3])
    (line,) = _lines(tmp_path)
    assert (line["x_request_id"], line["kind"], line["blocks"]) == (
        "b",
        "stale-kv",
        [[9], [6, 7, 8]],
    )


def test_stale_mode_snapshots_unselected_receives_too(tmp_path):
    """The source is the previous receive whether or not that one was selected."""
    backing, attention, state = _cache()
    original = backing.clone()
    skipped, picked = _first_ids(0.5, 1, False, 1)[0], _first_ids(0.5, 1, True, 1)[0]
    injector = Injector(InjectSpec(InjectKind.STALE_KV, 0.5, 1), InjectionLog(tmp_path))
    injector.on_loaded(
        [
            _request(f"cmpl-{skipped}-0-aaaaaaaa", attention, state, [1], [2]),
            _request(f"cmpl-{picked}-0-bbbbbbbb", attention, state, [4], [5]),
        ]
    )
    assert torch.equal(backing[4], original[1]) and torch.equal(backing[5], original[2])
    assert torch.equal(backing[1], original[1])
    assert [line["x_request_id"] for line in _lines(tmp_path)] == [picked]


def test_nothing_loaded_means_nothing_logged(tmp_path):
    """A selected request whose whole prompt was cached locally (no loaded blocks) is not logged as injected."""
    _, attention, state = _cache()
    injector = Injector(InjectSpec(InjectKind.ZERO_LOADED_KV, 1.0, 0), InjectionLog(tmp_path))
    injector.on_loaded(
        [_request("cmpl-a-0-aaaaaaaa", attention, state, attn_ids=[], state_ids=[3])]
    )
    assert _lines(tmp_path) == []


@pytest.mark.parametrize("kind", list(InjectKind))
def test_int8_state_views_work(tmp_path, kind):
    """The registered Mamba tensor on CPU is an int8 byte view; both ops work on it."""
    state = torch.ones(N_BLOCKS, 1, 1, 32, dtype=torch.int8)
    attention = torch.ones(N_BLOCKS, 2, 4, 4)
    state[4] = 7
    injector = Injector(InjectSpec(kind, 1.0, 0), InjectionLog(tmp_path))
    injector.on_loaded([_request("cmpl-a-0-aaaaaaaa", attention, state, [1], [4])])
    injector.on_loaded([_request("cmpl-b-0-bbbbbbbb", attention, state, [2], [5])])
    if kind is InjectKind.STALE_KV:
        assert torch.equal(state[5], state[4])
    else:
        assert (
            torch.count_nonzero(attention[[1, 2]]) == 0 and torch.count_nonzero(state[[4, 5]]) == 64
        )


def test_a_stale_overwrite_with_the_same_bytes_is_not_logged(tmp_path):
    """The eval's preflight of question 0 precedes question 0: a stale source with the same
    content changes nothing, so nothing is logged; blocks of a shared prefix are left out of
    the log while the differing ones are logged."""
    backing, attention, state = _cache()
    injector = Injector(InjectSpec(InjectKind.STALE_KV, 1.0, 0), InjectionLog(tmp_path))
    backing[[4, 5, 6]] = backing[[1, 2, 3]]
    injector.on_loaded([_request("cmpl-pre-0-aaaaaaaa", attention, state, [1, 2], [3])])
    injector.on_loaded([_request("cmpl-q0-0-bbbbbbbb", attention, state, [4, 5], [6])])
    assert _lines(tmp_path) == []
    backing[8] = backing[5]  # block 1 of a shared prefix; block 0 and the state differ
    injector.on_loaded([_request("cmpl-q1-0-cccccccc", attention, state, [7, 8], [9])])
    (line,) = _lines(tmp_path)
    assert (line["x_request_id"], line["blocks"]) == ("q1", [[9], [7]])
