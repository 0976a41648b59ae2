"""Placement groups for `--backend ray`, planned and checked with no cluster: pure functions."""

from __future__ import annotations

import dataclasses

import pytest

from pdcheck.contracts.server_records import ServerPorts
from pdcheck.errors import ExitCode, GpuInventoryError
from pdcheck.serving.plan import ServerPlan
from pdcheck.serving.ray_hosts import write_changes
from pdcheck.serving.ray_placement import (
    NodeResources,
    NodeSeat,
    check_placeable,
    group_request,
    seat_server,
    unplaceable,
)
from tests.unit.serving.conftest import make_cell


def _nodes(*totals: dict[str, float]) -> list[NodeResources]:
    return [NodeResources(f"{i:02d}" * 20, f"10.0.0.{i}", t) for i, t in enumerate(totals)]


def test_cross_node_pd_is_strict_spread_with_a_bundle_per_server():
    """cross-node: every PD server gets a bundle of its own (one GPU per TP rank and a CPU on a
    GPU platform, one CPU per rank on CPU) and STRICT_SPREAD; same-node is STRICT_PACK; a
    baseline is one bundle."""
    cell = make_cell(matrix={"prefill_tp": [2], "decode_instances": [2]})
    pd = group_request(cell, roles=("prefill", "decode"), placement="cross-node", platform="gpu")
    assert pd.strategy == "STRICT_SPREAD"
    assert pd.servers == ("prefill-0", "decode-0", "decode-1")
    assert pd.bundles == ({"CPU": 1, "GPU": 2}, {"CPU": 1, "GPU": 1}, {"CPU": 1, "GPU": 1})
    same = group_request(cell, roles=("prefill", "decode"), placement="same-node", platform="cpu")
    assert same.strategy == "STRICT_PACK"
    assert same.bundles == ({"CPU": 2}, {"CPU": 1}, {"CPU": 1})
    base = group_request(cell, roles=("baseline",), placement="cross-node", platform="cpu")
    assert (base.strategy, base.servers) == ("STRICT_PACK", ("baseline-0",))
    assert "STRICT_SPREAD" in pd.render() and "decode-1" in pd.render()


def test_spread_needs_distinct_nodes_that_each_fit_their_server():
    """STRICT_SPREAD fits only when each server has a node of its own with its resources;
    STRICT_PACK only when one node holds them all."""
    cell = make_cell(matrix={"prefill_tp": [2]})
    spread = group_request(
        cell, roles=("prefill", "decode"), placement="cross-node", platform="gpu"
    )
    pack = group_request(cell, roles=("prefill", "decode"), placement="same-node", platform="gpu")
    two_nodes = _nodes({"CPU": 8, "GPU": 1}, {"CPU": 8, "GPU": 2})
    assert unplaceable(spread, two_nodes) is None
    assert unplaceable(spread, _nodes({"CPU": 8, "GPU": 4})) is not None
    assert unplaceable(spread, _nodes({"CPU": 8, "GPU": 1}, {"CPU": 8, "GPU": 1})) is not None
    assert unplaceable(pack, _nodes({"CPU": 8, "GPU": 3})) is None
    assert unplaceable(pack, two_nodes) is not None


def test_a_group_that_cannot_be_placed_is_refused_with_what_it_needs_and_what_exists():
    """The error is a config error (exit 3, nothing started) naming the topology, its needs per
    server and every node's resources."""
    cell = make_cell()
    request = group_request(
        cell, roles=("prefill", "decode"), placement="cross-node", platform="gpu"
    )
    with pytest.raises(GpuInventoryError) as err:
        check_placeable([request], _nodes({"CPU": 16, "GPU": 8}))
    message = str(err.value)
    assert err.value.exit_code == ExitCode.CONFIG
    assert cell.name in message and "2 different nodes" in message
    assert "prefill-0 1 CPU, 1 GPU" in message and "10.0.0.0 (00000000): 16 CPU, 8 GPU" in message
    check_placeable([request], _nodes({"CPU": 1, "GPU": 1}, {"CPU": 1, "GPU": 1}))


def test_a_seated_server_is_reached_at_its_node_and_advertises_it_to_nixl(tmp_path):
    """Seating a planned server keeps what it listens on, but its URL, its NIXL side-channel
    host and its GPUs become those of its node; a baseline gets no side channel."""
    server = ServerPlan(
        role="decode",
        index=0,
        argv=("vllm", "serve", "m", "--host", "0.0.0.0"),
        env={"CUDA_VISIBLE_DEVICES": "5", "VLLM_PORT": "10000"},
        ports=ServerPorts(http=20001, side_channel=21000, vllm_port=10000),
        host="0.0.0.0",
        log_path=tmp_path / "decode-0.log",
        plugin_dir=tmp_path / "plugin",
        gpus=("5",),
    )
    seat = NodeSeat("ab" * 28, "10.1.2.3", ("0",))
    seated = seat_server(server, seat)
    assert seated.url == "http://10.1.2.3:20001"
    assert seated.argv == server.argv
    assert seated.env["VLLM_NIXL_SIDE_CHANNEL_HOST"] == "10.1.2.3"
    assert (seated.env["CUDA_VISIBLE_DEVICES"], seated.gpus) == ("0", ("0",))
    baseline = seat_server(dataclasses.replace(server, role="baseline", env={}), seat)
    assert "VLLM_NIXL_SIDE_CHANNEL_HOST" not in baseline.env


def test_mirrored_files_are_appended_at_their_offset_or_replaced_whole(tmp_path):
    """A host's changes land under the results folder: appended logs continue where they were
    (a repeated chunk overwrites, never duplicates), rewritten files are replaced whole."""
    write_changes(tmp_path, [("logs/decode-0.log", 0, b"one\n"), ("plugin/m.json", -1, b"{}")])
    write_changes(tmp_path, [("logs/decode-0.log", 4, b"two\n"), ("plugin/m.json", -1, b"[1]")])
    write_changes(tmp_path, [("logs/decode-0.log", 4, b"two\n")])
    assert (tmp_path / "logs/decode-0.log").read_text() == "one\ntwo\n"
    assert (tmp_path / "plugin/m.json").read_text() == "[1]"
