"""Which requests get a fault: the client's id, recovered exactly, hashed with the seed."""

from __future__ import annotations

import random

import pytest

from pdcheck.vllm_plugin.selection import client_request_id, is_selected


@pytest.mark.parametrize(
    ("worker_id", "client"),
    [
        ("cmpl-pd-c8-r0-q00042-0-1a2b3c4d", "pd-c8-r0-q00042"),
        ("cmpl-pd-c8-r0-q00042-3-deadbeef", "pd-c8-r0-q00042"),
        ("cmpl-pd-q00001-0-12345678", "pd-q00001"),  # an all-digit random suffix (about 2% of ids)
        ("cmpl-run-7-0-0a0b0c0d", "run-7"),  # a client id that itself ends in digits
        ("cmpl-pd-q00042-0", "pd-q00042"),  # VLLM_DISABLE_REQUEST_ID_RANDOMIZATION
        ("chatcmpl-pd-q00042-abcdef01", "pd-q00042"),
        ("chatcmpl-pd-q00042", "pd-q00042"),
        ("something-else", "something-else"),
    ],
)
def test_client_request_id_strips_vllm_decorations(worker_id, client):
    """The `cmpl-` prefix, prompt index and 8-char random suffix are stripped; other ids are kept whole."""
    assert client_request_id(worker_id) == client


def test_selection_ignores_the_random_suffix():
    """Two runs of the same question (different random suffixes) get the same decision."""
    for q in range(200):
        a = client_request_id(f"cmpl-pd-q{q:05d}-0-{random.getrandbits(32):08x}")
        b = client_request_id(f"cmpl-pd-q{q:05d}-0-{random.getrandbits(32):08x}")
        assert is_selected(a, fraction=0.5, seed=3) == is_selected(b, fraction=0.5, seed=3)


def test_fraction_is_honoured_and_edges_are_exact():
    """About P of many ids are selected; P=0 selects none and P=1 all."""
    ids = [f"pd-c1-r0-q{i:05d}" for i in range(20000)]
    for fraction in (0.1, 0.5, 0.9):
        share = sum(is_selected(i, fraction=fraction, seed=11) for i in ids) / len(ids)
        assert abs(share - fraction) < 0.015, (fraction, share)
    assert not any(is_selected(i, fraction=0.0, seed=11) for i in ids)
    assert all(is_selected(i, fraction=1.0, seed=11) for i in ids)


def test_selection_is_nested_in_the_fraction_and_depends_on_the_seed():
    """A larger fraction selects a superset; another seed selects another set."""
    ids = [f"q{i:05d}" for i in range(2000)]
    small = {i for i in ids if is_selected(i, fraction=0.2, seed=1)}
    large = {i for i in ids if is_selected(i, fraction=0.6, seed=1)}
    other = {i for i in ids if is_selected(i, fraction=0.2, seed=2)}
    assert small < large
    assert small != other


def test_every_run_of_a_question_gets_the_same_decision():
    """`pd-c1-r0-q00042` and `pd-c8-r2-q00042` are one question: injected in both runs or in neither."""
    for q in range(500):
        decisions = {
            is_selected(f"{tag}-q{q:05d}", fraction=0.5, seed=9)
            for tag in ("pd-c1-r0", "pd-c8-r2", "x")
        }
        assert len(decisions) == 1
    other = [f"req-{i}" for i in range(500)]  # ids without a question suffix are hashed whole
    assert len({is_selected(i, fraction=0.5, seed=9) for i in other}) == 2
