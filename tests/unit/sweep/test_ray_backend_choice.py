"""Choosing the Ray backend and its settings, and refusing it cleanly: no cluster needed."""

from __future__ import annotations

import sys

import pytest

from pdcheck.cli import main
from pdcheck.config.schema import RaySettings
from pdcheck.errors import ConfigError
from pdcheck.sweep.backends import BackendChoice, ray_settings


def test_the_file_section_or_the_option_selects_ray_and_options_override_the_file():
    """No `ray` section and no option: local. `--backend ray` alone: the defaults. The file's
    section selects Ray; `--ray-*` options override its values; `--backend local` wins."""
    file = RaySettings(address="10.0.0.1:6379", placement="same-node")
    assert ray_settings(None, BackendChoice()) is None
    assert ray_settings(None, BackendChoice("ray")) == RaySettings()
    assert ray_settings(file, BackendChoice()) == file
    assert ray_settings(file, BackendChoice(ray_placement="cross-node")) == RaySettings(
        address="10.0.0.1:6379", placement="cross-node"
    )
    assert ray_settings(None, BackendChoice(ray_address="auto")) == RaySettings(address="auto")
    assert ray_settings(file, BackendChoice("local")) is None
    with pytest.raises(ConfigError, match="--backend ray"):
        ray_settings(None, BackendChoice("local", ray_address="auto"))


def test_backend_ray_without_ray_installed_says_what_to_install_and_exits_3(
    monkeypatch, tmp_path, capsys
):
    """Without Ray, `--backend ray` exits 3 naming the extra to install, and writes nothing
    (and fetches no model: the sweep's model folder does not exist)."""
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` raises ImportError
    sweep = tmp_path / "sweep.yaml"
    sweep.write_text("name: t\nmodels:\n  - {name: m, path: hub-org/not-fetched}\n")
    out = tmp_path / "run"
    assert main(["sweep", str(sweep), "--backend", "ray", "--out", str(out)]) == 3
    assert "pip install 'pdcheck[ray]'" in capsys.readouterr().err
    assert not out.exists()


def test_vllm_cpu_servers_are_forked_by_their_nodes_one_fork_server_actor_per_node(
    monkeypatch, tmp_path
):
    """A vllm-cpu server (pdcheck's launcher module) is started through the fork servers of its
    own node, each node's `NodeForkServers` started once and stopped when the backend closes; a
    server started by any other command, or with the fork server switched off, gets none."""
    from pdcheck.serving.gpus import GpuInventory
    from pdcheck.serving.ray_placement import NodeSeat
    from pdcheck.sweep import ray_backend
    from tests.unit.serving.conftest import make_cell

    started: list[str] = []
    stopped: list[list[str]] = []
    monkeypatch.setattr(
        ray_backend,
        "start_node_fork_servers",
        lambda node_id, timeout_s: started.append(node_id) or f"forks@{node_id}",
    )
    monkeypatch.setattr(ray_backend, "stop_node_fork_servers", stopped.append)

    nodes = {"prefill-0": "node-a", "decode-0": "node-b", "baseline-0": "node-b"}

    class Group:
        def seat(self, name):
            return NodeSeat(nodes[name], "127.0.0.1")

        def launch(self, server, *, fork_servers=None):
            return (server.name, fork_servers)

    class Server:
        def __init__(self, name, argv):
            self.name, self.argv = name, argv

    vllm_cpu = [sys.executable, "-m", "pdcheck._vllm.launch", "serve", "m"]
    backend = ray_backend.RayBackend(GpuInventory((), "none"))
    launch = backend._launcher(Group(), make_cell())
    assert launch(Server("prefill-0", vllm_cpu)) == ("prefill-0", "forks@node-a")
    assert launch(Server("decode-0", vllm_cpu)) == ("decode-0", "forks@node-b")
    assert launch(Server("baseline-0", vllm_cpu)) == ("baseline-0", "forks@node-b")
    assert launch(Server("decode-0", ["vllm", "serve", "m"])) == ("decode-0", None)
    monkeypatch.setenv("PDCHECK_CPU_FORK_SERVER", "0")
    assert launch(Server("prefill-0", vllm_cpu)) == ("prefill-0", None)
    assert started == ["node-a", "node-b"]
    backend.close()
    assert stopped == [["forks@node-a", "forks@node-b"]]


def test_a_nodes_fork_servers_refuse_a_host_of_another_session(tmp_path):
    """A fork joins its launcher's process group, which only works within one session: asked
    for by a host in another session, a node's fork servers answer None (the server starts on
    its own) and start nothing."""
    import os

    from pdcheck.serving.ray_hosts import NodeForkServers

    forks = NodeForkServers()
    try:
        assert forks.socket_for(sys.executable, dict(os.environ), os.getsid(0) + 1) is None
        assert not forks._fork_servers._servers
    finally:
        forks.stop()
