"""Server lifecycle with stand-in servers (tests/fakes/stub_server.py): readiness, crashes, teardown.

The stand-in forks a child like vLLM's engine process and records both pids, so every test
can check that nothing is left behind. (Moved from tests/unit: every test starts processes.)
"""

from __future__ import annotations

import signal
import socket
import time

import pytest

from pdcheck.errors import ServerCrashed, ServerStartTimeout
from pdcheck.serving.ports import default_allocator
from pdcheck.serving.process import stop_all, wait_all_ready
from tests.fakes.stub_topology import alive, recorded_pids, stub, wait_gone


@pytest.fixture
def ports():
    return default_allocator()


def test_ready_server_stops_with_its_child(tmp_path, ports):
    """A healthy server and the child it forked are both gone after stop()."""
    with stub(tmp_path, "ok", ports.http_port()) as server:
        server.wait_ready(timeout_s=20)
        pids = recorded_pids(tmp_path / "pids")
        assert len(pids) == 2 and all(alive(p) for p in pids)
    assert wait_gone(pids) == []
    assert (tmp_path / "logs" / "ok-0.log").read_text().startswith("stub server mode=ok")


def test_teardown_signals_the_leader_first_so_it_stops_its_own_children(tmp_path, ports):
    """The leader alone gets the first SIGTERM: vLLM's API server stops its engine core itself,
    and an engine core signalled at the same time dies under it and fills the log with an
    EngineDeadError traceback at every clean stop. The stand-in's child records who sent its
    SIGTERM: the leader, not pdcheck's group signal."""
    with stub(tmp_path, "stops-child", ports.http_port()) as server:
        server.wait_ready(timeout_s=20)
        pids = recorded_pids(tmp_path / "pids")
    assert wait_gone(pids) == []
    (sender,) = (tmp_path / "pids").glob("*.term-sender")
    assert int(sender.read_text()) == pids[0], f"leader {pids[0]}, child {pids[1]}"
    assert server.returncode() == 0


def test_crash_at_start_fails_fast_with_log_tail(tmp_path, ports):
    """A server that exits during startup raises ServerCrashed at once, with exit code and log tail."""
    t0 = time.monotonic()
    with stub(tmp_path, "crash", ports.http_port()) as server, pytest.raises(ServerCrashed) as err:
        server.wait_ready(timeout_s=60)
    assert time.monotonic() - t0 < 15
    assert err.value.returncode == 3 and err.value.role == "crash-0"
    assert "told to crash at start" in err.value.log_tail and "crash-0.log" in str(err.value)


def test_never_healthy_times_out_and_is_cleaned_up(tmp_path, ports):
    """A server that never answers /health 200 gives ServerStartTimeout; its group is still stopped."""
    with (
        stub(tmp_path, "never-healthy", ports.http_port()) as server,
        pytest.raises(ServerStartTimeout, match=r"within 1.5 s"),
    ):
        server.wait_ready(timeout_s=1.5)
    assert wait_gone(recorded_pids(tmp_path / "pids")) == []


def test_sigterm_ignoring_server_is_killed_after_grace(tmp_path, ports):
    """Teardown escalates to SIGKILL when the group ignores SIGTERM past the grace period."""
    server = stub(tmp_path, "ignore-term", ports.http_port(), grace_s=1.0)
    with server:
        server.wait_ready(timeout_s=20)
        pids = recorded_pids(tmp_path / "pids")
        t0 = time.monotonic()
    assert server.returncode() == -signal.SIGKILL
    assert 0.9 < time.monotonic() - t0 < 8
    assert wait_gone(pids) == []


def test_port_already_taken_is_a_crash_naming_the_server(tmp_path, ports):
    """A server whose port someone else holds exits; the error names it and shows why."""
    port = ports.http_port()
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", port))
        holder.listen()
        with (
            stub(tmp_path, "ok", port) as server,
            pytest.raises(ServerCrashed, match="ok-0 exited") as err,
        ):
            server.wait_ready(timeout_s=20)
    assert "Address already in use" in err.value.log_tail


def test_one_crash_among_several_fails_the_wait_and_stop_all_cleans_up(tmp_path, ports):
    """Parallel start: the first crash fails the whole wait, and stop_all leaves no process."""
    servers = [stub(tmp_path, "ok", ports.http_port()), stub(tmp_path, "crash", ports.http_port())]
    try:
        for s in servers:
            s.start()
        with pytest.raises(ServerCrashed, match="crash-0"):
            wait_all_ready(servers, timeout_s=30)
    finally:
        stop_all(servers)
    assert wait_gone(recorded_pids(tmp_path / "pids")) == []
