"""Which servers the vLLM fork server starts, which share one, and what `--dry-run` says of it."""

from __future__ import annotations

from pdcheck.serving.forkserver import (
    FORK_SERVER_SWITCH,
    FORKED_NOTE,
    forkable,
    import_env,
)
from pdcheck.serving.plan import plan_topology
from pdcheck.serving.ports import PortAllocator
from tests.fakes.nvidia_smi import fake_inventory
from tests.unit.serving.conftest import make_cell


def _plan(tmp_path, platform: str, **cell):
    return plan_topology(
        make_cell(serving={"platform": platform}, **cell),
        inventory=fake_inventory(3),
        ports=PortAllocator(bucket=7),
        run_dir=tmp_path,
        cpu_count=2,
    )


def test_only_cpu_servers_from_pdcheck_launcher_are_forked(tmp_path, monkeypatch):
    """Every CPU server of a plan starts through the fork server, and --dry-run says so; a GPU
    server starts from vLLM's own CLI, a bare `vllm` executable is never forked, and
    PDCHECK_CPU_FORK_SERVER=0 starts CPU servers on their own."""
    cpu, gpu = _plan(tmp_path, "cpu"), _plan(tmp_path, "gpu")
    assert all(forkable(s.argv) for s in cpu.servers)
    assert FORKED_NOTE in cpu.render()
    assert not any(forkable(s.argv) for s in gpu.servers)
    assert FORKED_NOTE not in gpu.render()
    assert not forkable(["vllm", "serve", "m"])
    monkeypatch.setenv(FORK_SERVER_SWITCH, "0")
    assert not any(forkable(s.argv) for s in cpu.servers)
    assert FORKED_NOTE not in cpu.render()


def test_servers_of_a_sweep_share_the_import_but_not_a_changed_environment(tmp_path):
    """Baseline, prefill and decode, full-attention or hybrid, canary or not, differ only in
    variables read after the fork, so they share one import; any other variable, which the
    import could read, gets a fork server of its own."""
    plans = [
        _plan(tmp_path, "cpu"),
        _plan(tmp_path, "cpu", matrix={"arms": ["inject-zero"]}),
        _plan(tmp_path, "cpu", model={"kind": "hybrid"}),
    ]
    keys = {import_env({"PATH": "/bin", **s.env}) for plan in plans for s in plan.servers}
    assert len(keys) == 1
    server = plans[0].servers[0]
    assert import_env({**server.env, "HF_HUB_OFFLINE": "0"}) != import_env(server.env)
    assert import_env({**server.env, "OMP_NUM_THREADS": "2"}) != import_env(server.env)
