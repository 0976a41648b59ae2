"""How a server on a Ray node that stopped is reported, with a stand-in for Ray (no cluster):
from its node's state when its exit is first reported, never from which death pdcheck saw
first (issue 43)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from pdcheck.contracts.server_records import ServerPorts
from pdcheck.errors import ServerCrashed
from pdcheck.serving import ray_hosts
from pdcheck.serving.forkserver import FORKSERVER_ENV
from pdcheck.serving.plan import ServerPlan
from pdcheck.serving.ray_hosts import NodeLost, RayServerProcess
from pdcheck.serving.ray_placement import NodeSeat

NODE_ID = "ab" * 28
SEAT = NodeSeat(NODE_ID, "10.1.2.3")
SOCKET = "/tmp/pdcheck-ray-forks-x/pdcheck-fork-y/fork.sock"


class ActorDied(Exception):
    pass


class GetTimeout(Exception):
    pass


@dataclass
class FakeNode:
    """What the stand-in Ray answers about the server's node; each field may change per call."""

    rc: int | None = 1
    in_gcs: bool = True
    raylet: bool = True
    host: bool = True
    fork_servers: bool = True
    fork_server: bool = True
    # Applied before each question from the classification (the node dying meanwhile).
    later: list[Callable[[FakeNode], None]] = field(default_factory=list)
    questions: int = 0


class _Method:
    def __init__(self, answer: Callable[[], Any]):
        self._answer = answer

    def remote(self, *args: Any) -> Callable[[], Any]:
        return self._answer


def fake_ray(node: FakeNode) -> SimpleNamespace:
    def get(ref: Callable[[], Any], timeout: float) -> Any:
        return ref()

    def nodes() -> list[dict[str, Any]]:
        node.questions += 1
        if node.later:
            node.later.pop(0)(node)
        return [{"NodeID": NODE_ID, "Alive": node.in_gcs}]

    return SimpleNamespace(
        get=get,
        nodes=nodes,
        exceptions=SimpleNamespace(RayActorError=ActorDied, GetTimeoutError=GetTimeout),
    )


def _alive(node: FakeNode, part: str, answer: Callable[[], Any]) -> Callable[[], Any]:
    def call() -> Any:
        if not getattr(node, part):
            raise ActorDied(f"the {part} actor died")
        return answer()

    return call


def server(node: FakeNode, tmp_path: Path, monkeypatch) -> RayServerProcess:
    """A forked server that has started on its node; its host and fork servers answer as
    `node` says."""
    monkeypatch.setattr(ray_hosts, "import_ray", lambda: fake_ray(node))
    monkeypatch.setattr(ray_hosts, "NODE_LOSS_WAIT_S", 0.2)
    monkeypatch.setattr(ray_hosts, "NODE_LOSS_POLL_S", 0.01)
    host = SimpleNamespace(
        start=_Method(_alive(node, "host", lambda: (4242, SOCKET))),
        poll=_Method(_alive(node, "host", lambda: (node.rc, []))),
        raylet_alive=_Method(_alive(node, "host", lambda: node.raylet)),
    )
    fork_servers = SimpleNamespace(
        serving=_Method(_alive(node, "fork_servers", lambda: node.fork_server))
    )
    plan = ServerPlan(
        role="prefill",
        index=0,
        argv=("python", "-m", "pdcheck._vllm.launch", "serve", "m"),
        env={},
        ports=ServerPorts(http=20001, side_channel=21000, vllm_port=10000),
        host=SEAT.address,
        log_path=tmp_path / "prefill-0.log",
        plugin_dir=tmp_path / "plugin",
    )
    process = RayServerProcess(
        plan, host=host, seat=SEAT, results_root=tmp_path, fork_servers=fork_servers
    )
    process.start()
    assert process.env[FORKSERVER_ENV] == SOCKET
    return process


@pytest.mark.parametrize(
    "gone",
    [
        pytest.param({"in_gcs": False}, id="Ray reports the node dead"),
        pytest.param({"raylet": False}, id="the node's raylet exited, not yet noticed by Ray"),
        pytest.param({"host": False}, id="the host actor died after reporting the exit"),
        pytest.param({"fork_server": False}, id="the node's vLLM fork server died"),
        pytest.param({"fork_servers": False}, id="the node's fork-server actor died"),
    ],
)
def test_an_exit_with_its_node_gone_is_node_lost_naming_the_node(gone, tmp_path, monkeypatch):
    """The host reports the server's exit code first (as when the node's fork server went down
    with the node a moment before Ray noticed): with its node, raylet, host or fork server gone
    the server is `NodeLost` naming the node, not `ServerCrashed` with that exit code."""
    # Gone once the host has reported the exit, before pdcheck asks about the node.
    node = FakeNode(later=[lambda n: [setattr(n, part, v) for part, v in gone.items()]])
    process = server(node, tmp_path, monkeypatch)
    with pytest.raises(NodeLost) as lost:
        process.check_alive()
    assert SEAT.label in str(lost.value)


def test_an_exit_on_a_live_node_is_server_crashed_with_its_code(tmp_path, monkeypatch):
    """A server killed on a node whose raylet, host and fork server all run (vLLM's OOM kill):
    `ServerCrashed` with the exit code, after the bounded wait for a node loss to show."""
    node = FakeNode(rc=137)
    process = server(node, tmp_path, monkeypatch)
    with pytest.raises(ServerCrashed) as crashed:
        process.check_alive()
    assert not isinstance(crashed.value, NodeLost)
    assert crashed.value.returncode == 137
    assert SEAT.label in str(crashed.value)
    assert node.questions > 1, "the node's state was asked again within the wait"


def test_a_node_that_goes_within_the_wait_is_node_lost(tmp_path, monkeypatch):
    """Ray notices a node's death seconds after it: a server whose exit came first, on a node
    Ray declares dead within NODE_LOSS_WAIT_S, is `NodeLost`."""
    node = FakeNode(later=[lambda n: None, lambda n: None, lambda n: setattr(n, "in_gcs", False)])
    process = server(node, tmp_path, monkeypatch)
    with pytest.raises(NodeLost):
        process.check_alive()


def test_the_class_is_decided_once(tmp_path, monkeypatch):
    """Every later check reports what the first one decided, whatever the node did since."""
    node = FakeNode(rc=137)
    process = server(node, tmp_path, monkeypatch)
    with pytest.raises(ServerCrashed) as first:
        process.check_alive()
    node.in_gcs = False
    with pytest.raises(ServerCrashed) as again:
        process.check_alive()
    assert again.value is first.value


def test_a_running_server_on_a_live_node_passes_its_check(tmp_path, monkeypatch):
    """No exit code: nothing is raised, and the node is not asked about."""
    node = FakeNode(rc=None)
    process = server(node, tmp_path, monkeypatch)
    process.check_alive()
    assert node.questions == 0
