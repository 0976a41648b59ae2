"""Topologies of stand-in servers: PD through the proxy, a decoder dying mid-run, and an arm that
needs the plugin refused without its markers. (Moved from tests/unit: they start processes.)"""

from __future__ import annotations

import os
import signal

import pytest

from pdcheck.errors import InfraError, ServerCrashed
from pdcheck.serving import serve_pd, serve_topology
from tests.fakes.stub_topology import complete, recorded_pids, stub_plan, wait_gone


def test_pd_through_proxy_then_decoder_dies_mid_run(tmp_path, worker_index):
    """Requests flow prefill→decode via the proxy; a decoder that dies gives 502 (side decode) and check_alive raises."""
    plan = stub_plan(tmp_path, worker_index)
    with serve_topology(plan) as endpoints:
        assert complete(endpoints.pd_url)[0] == 200
        assert complete(endpoints.baseline_url)[0] == 200
        assert set(endpoints.log_paths) == {"prefill-0", "decode-0", "baseline-0"}
        decoder = next(p for p in endpoints.processes if p.name == "decode-0")
        os.killpg(decoder.pid, signal.SIGKILL)
        decoder._proc.wait()
        status, body = complete(endpoints.pd_url)
        assert status == 502 and body["error"]["side"] == "decode"
        with pytest.raises(ServerCrashed, match="decode-0"):
            endpoints.check_alive()
        pids = recorded_pids(tmp_path / "pids")
    assert wait_gone(pids) == []


def test_arm_needing_the_plugin_is_refused_without_activation_markers(tmp_path, worker_index):
    """A fixes-off arm whose servers wrote no plugin marker is an InfraError, and nothing is left running."""
    plan = stub_plan(tmp_path, worker_index, arm="fixes-off")
    with pytest.raises(
        InfraError,
        match=r"plugin did not activate as the arm needs: prefill-0 .*no activation marker",
    ):
        with serve_pd(plan):
            pass
    assert wait_gone(recorded_pids(tmp_path / "pids")) == []
