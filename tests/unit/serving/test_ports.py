"""Port allocation: disjoint ranges per role, per xdist worker and per topology; taken ports skipped."""

from __future__ import annotations

import socket

import pytest

from pdcheck.errors import PortUnavailable
from pdcheck.serving.ports import (
    SIDE_CHANNEL_STRIDE,
    SLOTS_PER_WORKER,
    VLLM_PORT_STRIDE,
    WORKER_BUCKETS,
    PortAllocator,
    release_claims,
    require_free_port,
    worker_bucket,
)


def _all_ports(bucket: int) -> list[set[int]]:
    alloc = PortAllocator(bucket=bucket)
    out = []
    for slot in range(SLOTS_PER_WORKER):
        p = alloc.slot_ports(slot)
        out.append(
            {
                p.http,
                *range(p.side_channel, p.side_channel + SIDE_CHANNEL_STRIDE),
                *range(p.vllm_port, p.vllm_port + VLLM_PORT_STRIDE),
            }
        )
    return out


def test_every_slot_of_every_worker_is_disjoint_and_below_ephemeral_range():
    """No two slots (in any worker bucket) share a port, and none is in Linux's ephemeral range."""
    seen: set[int] = set()
    for bucket in range(WORKER_BUCKETS):
        for ports in _all_ports(bucket):
            assert not ports & seen
            seen |= ports
    assert max(seen) < 32768 and min(seen) >= 1024


def test_worker_bucket_keys_on_pytest_xdist_worker():
    """gwN maps to its own bucket; no worker variable means bucket 0."""
    assert worker_bucket({}) == 0
    assert worker_bucket({"PYTEST_XDIST_WORKER": "gw3"}) == 3
    assert worker_bucket({"PYTEST_XDIST_WORKER": f"gw{WORKER_BUCKETS + 1}"}) == 1


def test_successive_servers_in_one_process_never_share_ports():
    """Several topologies from one allocator get distinct slots."""
    alloc = PortAllocator(bucket=5)
    got = [alloc.server_ports(tp=2) for _ in range(12)] + [
        alloc.server_ports(tp=1) for _ in range(3)
    ]
    https = [p.http for p in got]
    sides = [s for p in got for s in range(p.side_channel, p.side_channel + 2)]
    assert len(set(https)) == len(https) and len(set(sides)) == len(sides)


def test_a_taken_port_is_skipped_and_a_fixed_one_raises():
    """A slot whose port is bound elsewhere is skipped; a port the user fixed raises PortUnavailable."""
    alloc = PortAllocator(bucket=6)
    taken = alloc.slot_ports(0)
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", taken.http))
        holder.listen()
        got = alloc.server_ports()
        assert got.http != taken.http
        with pytest.raises(PortUnavailable, match=str(taken.http)):
            require_free_port(taken.http, what="--port")


def test_tp_beyond_side_channel_block_is_refused():
    """A TP larger than the side-channel block would overlap the next slot: refused."""
    with pytest.raises(ValueError, match="outside"):
        PortAllocator(bucket=0).server_ports(tp=SIDE_CHANNEL_STRIDE + 1)


def test_a_released_slot_can_be_claimed_again_by_another_allocator():
    """A slot's claim holds while its server runs and is given up when it stops, so a second
    pdcheck on the machine is not starved by a long sweep that has cycled through its bucket."""
    holder = PortAllocator(bucket=6)
    taken = holder.server_ports()
    other = PortAllocator(bucket=6)
    assert taken not in [other.server_ports() for _ in range(3)]
    release_claims([taken.http])
    later = PortAllocator(bucket=6)  # it cycles through every slot no one else has claimed
    assert taken in [later.server_ports() for _ in range(SLOTS_PER_WORKER)]
