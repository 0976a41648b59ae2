"""The digest join: blocks pair by (prefiller request, TP rank, group, position); a differing
digest is a mismatch with its question; heterogeneous TP is refused, never compared."""

from __future__ import annotations

from collections.abc import Mapping

import msgspec
import pytest

from pdcheck.analysis import kv_digest
from pdcheck.analysis.kv_digest import digest_regression_reason
from pdcheck.contracts.plugin_files import DigestRecord, decode_digest_lines


def join_digests(records: list[Mapping], **kw):
    """The join over the records as the plugin's schema reads them."""
    return kv_digest.join_digests([msgspec.convert(r, DigestRecord) for r in records], **kw)


def _prefill(rid, groups, tp_rank=0):
    return {
        "side": "prefill",
        "prefill_request_id": rid,
        "x_request_id": rid,
        "tp_rank": tp_rank,
        "tp_size": 1,
        "groups": [{"group": g, "first_position": 0, "digests": d} for g, d in groups],
    }


def _decode(x_id, rid, groups, tp_rank=0, tp_size=1, remote_tp_size=1):
    return {
        "side": "decode",
        "prefill_request_id": rid,
        "x_request_id": x_id,
        "tp_rank": tp_rank,
        "tp_size": tp_size,
        "remote_tp_size": remote_tp_size,
        "groups": [{"group": g, "first_position": f, "digests": d} for g, f, d in groups],
    }


def test_equal_digests_count_every_block_and_no_mismatch():
    """A clean transfer: every decoder block is checked against its prefiller twin, none differs."""
    records = [
        _prefill("p1", [(0, ["a"]), (1, ["b", "c"])]),
        _decode("pd-c1-r0-q00001", "p1", [(0, 0, ["a"]), (1, 0, ["b", "c"])]),
    ]
    s = join_digests(records, run_tag="pd-c1-r0")
    assert (s.requests_checked, s.blocks_checked, s.n_mismatches) == (1, 3, 0)
    assert digest_regression_reason(s) is None


def test_one_changed_block_is_one_mismatch_with_its_question_group_and_position():
    """Only the differing block is reported, with the question recovered from the X-Request-Id."""
    records = [
        _prefill("p7", [(1, ["b", "c", "d"])]),
        _decode("pd-c8-r0-q00007", "p7", [(1, 0, ["b", "X", "d"])]),
        _prefill("p8", [(1, ["e"])]),
        _decode("pd-c8-r0-q00008", "p8", [(1, 0, ["e"])]),
    ]
    s = join_digests(records)
    assert (s.blocks_checked, s.n_mismatches, s.mismatched_questions) == (4, 1, (7,))
    (m,) = s.mismatches
    assert (m.question, m.group, m.position, m.tp_rank) == (7, 1, 1, 0)
    reason = digest_regression_reason(s)
    assert reason is not None and "1 of 4 KV blocks" in reason and "q00007" in reason


def test_prefix_hit_decoder_pairs_its_tail_by_position():
    """A decoder that loaded only blocks 2..3 (prefix-cache hit) is compared with the prefiller's 2..3."""
    records = [
        _prefill("p1", [(0, ["a", "b", "c", "d"])]),
        _decode("pd-q00001", "p1", [(0, 2, ["c", "d"])]),
    ]
    s = join_digests(records)
    assert (s.blocks_checked, s.n_mismatches, s.unpaired_blocks) == (2, 0, 0)


def test_ranks_pair_with_the_same_rank_only():
    """TP 2 on both sides: rank 1's decoder blocks are compared with the prefiller's rank 1."""
    records = [
        _prefill("p1", [(0, ["r0"])], tp_rank=0),
        _prefill("p1", [(0, ["r1"])], tp_rank=1),
        _decode("pd-q00001", "p1", [(0, 0, ["r0"])], tp_rank=0, tp_size=2, remote_tp_size=2),
        _decode("pd-q00001", "p1", [(0, 0, ["r1"])], tp_rank=1, tp_size=2, remote_tp_size=2),
    ]
    s = join_digests(records)
    assert (s.requests_checked, s.blocks_checked, s.n_mismatches) == (2, 2, 0)


def test_heterogeneous_tp_is_refused_not_compared():
    """Decoder TP 2 reading a TP 1 prefiller: nothing is compared, and the refusal says why."""
    records = [
        _prefill("p1", [(0, ["a"])]),
        _decode("pd-q00001", "p1", [(0, 0, ["z"])], tp_size=2, remote_tp_size=1),
    ]
    s = join_digests(records)
    assert (s.blocks_checked, s.n_mismatches) == (0, 0)
    assert s.refused is not None and "prefiller TP 1 and decoder TP 2" in s.refused
    assert digest_regression_reason(s) is None


def test_loads_without_a_prefiller_record_and_other_runs_are_counted_apart():
    """A decoder record with no prefiller twin is unmatched, not a mismatch; other run tags are ignored."""
    records = [
        _decode("pd-c1-r0-q00001", "gone", [(0, 0, ["a"])]),
        _decode("pd-c8-r0-q00001", "p1", [(0, 0, ["zzz"])]),
        _prefill("p1", [(0, ["a"])]),
    ]
    s = join_digests(records, run_tag="pd-c1-r0")
    assert (s.requests_checked, s.unmatched_requests, s.n_mismatches) == (0, 1, 0)


def test_a_line_of_another_shape_is_refused_naming_the_field():
    """A line that is neither side, or lacks a field the join needs, is a corrupt log, refused
    when read with the field named, never silently skipped."""
    line = msgspec.json.encode({**_prefill("p1", [(0, ["a"])]), "side": "middle"})
    with pytest.raises(msgspec.ValidationError, match=r"\$\.side"):
        decode_digest_lines([line])
    with pytest.raises(msgspec.ValidationError, match="tp_rank"):
        decode_digest_lines([b'{"side": "decode", "prefill_request_id": "p", "x_request_id": "x"}'])


def test_a_load_whose_token_count_differs_between_the_sides_is_an_extent_mismatch():
    """Equal bytes but a decoder that takes the load to hold N-1 prompt tokens where the
    prefiller computed N (a hybrid's guard broken): an extent mismatch, a regression reason
    with both counts; equal counts, or a record without them, are none."""
    prefill = {**_prefill("p1", [(0, ["a", "b"])]), "num_tokens": 300}
    decode = {**_decode("run-q00003", "p1", [(0, 0, ["a", "b"])]), "load_tokens": 299}
    summary = join_digests([prefill, decode])
    assert summary.n_mismatches == 0 and summary.n_extent_mismatches == 1
    (extent,) = summary.extent_mismatches
    assert (extent.question, extent.decoder_tokens, extent.prefiller_tokens) == (3, 299, 300)
    reason = digest_regression_reason(summary)
    assert reason == (
        "1 of 1 loads hold another number of prompt tokens than the decoder takes them to "
        "(first q00003: prefiller 300, decoder 299)"
    )
    agreed = join_digests([prefill, {**decode, "load_tokens": 300}])
    assert agreed.n_extent_mismatches == 0 and digest_regression_reason(agreed) is None
    assert (
        join_digests(
            [prefill, _decode("run-q00003", "p1", [(0, 0, ["a", "b"])])]
        ).n_extent_mismatches
        == 0
    )


def _held(record, held, group=0, block_size=128, first_position=0):
    """`record` with its attention group's advertised blocks holding table positions `held`."""
    groups = [
        {**g, "held_positions": held, "block_size": block_size, "first_position": first_position}
        if g["group"] == group
        else g
        for g in record["groups"]
    ]
    return {**record, "groups": groups}


def test_an_advertised_list_out_of_block_table_order_is_an_order_mismatch():
    """The prefiller advertised blocks for positions 1 and 2 that hold the table's 2 and 1: an
    order mismatch of that load, said with the positions and the token ranges, and a regression
    reason though every digest agrees (a state group carries no order and is not judged)."""
    prefill = {
        **_held(_prefill("p1", [(0, ["a", "b", "c"]), (1, ["s"])]), [0, 2, 1]),
        "num_tokens": 290,
    }
    prefill["groups"][1]["state"] = True
    decode = _decode("run-q00004", "p1", [(0, 0, ["a", "b", "c"]), (1, 0, ["s"])])
    s = join_digests([prefill, decode])
    assert (s.n_mismatches, s.n_order_mismatches, s.order_unchecked) == (0, 1, 0)
    (order,) = s.order_mismatches
    assert (order.question, order.group, order.positions, order.held) == (4, 0, (1, 2), (2, 1))
    assert order.describe() == (
        "advertised block order disagrees with the block table at positions 1, 2 (q00004, "
        "group 0: the blocks sent there hold tokens 256-289, tokens 128-255)"
    )
    assert digest_regression_reason(s) == (
        "1 of 1 loads were advertised out of the prefiller's block-table order (first: "
        + order.describe()
        + ")"
    )


def test_a_list_that_is_the_table_tail_agrees_and_a_missing_table_is_unchecked():
    """A sliding window's advertised tail (first position 2, holding 2 and 3) agrees with the
    table; a prefiller record without held positions is counted unchecked, never a mismatch."""
    tail = _held(_prefill("p1", [(0, ["c", "d"])]), [2, 3], first_position=2)
    s = join_digests([tail, _decode("run-q00001", "p1", [(0, 2, ["c", "d"])])])
    assert (s.blocks_checked, s.n_order_mismatches, s.order_unchecked) == (2, 0, 0)
    assert digest_regression_reason(s) is None
    bare = join_digests(
        [_prefill("p1", [(0, ["a"])]), _decode("run-q00001", "p1", [(0, 0, ["a"])])]
    )
    assert (bare.n_order_mismatches, bare.order_unchecked) == (0, 1)
    assert digest_regression_reason(bare) is None
