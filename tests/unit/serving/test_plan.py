"""Topology plans: GPU sets on a simulated GPU inventory, CPU core binding, refusal before start.

How the inventory is read (nvidia-smi narrowed by CUDA_VISIBLE_DEVICES) is in
tests/slow/test_gpu_inventory.py: it runs a fake nvidia-smi.
"""

from __future__ import annotations

import pytest

from pdcheck.errors import ConfigError, GpuInventoryError
from pdcheck.serving.argv import flag_value
from pdcheck.serving.gpus import GpuInventory
from pdcheck.serving.plan import plan_topology
from pdcheck.serving.ports import PortAllocator
from tests.fakes.nvidia_smi import fake_inventory
from tests.unit.serving.conftest import gpu_cell, make_cell

# (prefill TP, decode TP) -> GPUs for PD plus a baseline at the decode TP
SHAPES = {"P2/D2": ((2, 2), 6), "P1/D2": ((1, 2), 5), "P2/D1": ((2, 1), 4)}


def _plan(cell, inventory, tmp_path, **kwargs):
    return plan_topology(
        cell, inventory=inventory, ports=PortAllocator(bucket=7), run_dir=tmp_path, **kwargs
    )


@pytest.mark.parametrize("gpus", [1, 2, 4, 8])
@pytest.mark.parametrize("shape", list(SHAPES))
def test_gpu_sets_are_disjoint_when_they_fit_else_shared_with_a_memory_share(tmp_path, gpus, shape):
    """With enough GPUs each server gets a disjoint contiguous CUDA_VISIBLE_DEVICES run of its
    own (vLLM's default memory share). With fewer, servers share GPUs: each rank still has a GPU
    of its own, every server on a shared GPU runs with `--gpu-memory-utilization` at most 0.9
    over all of them, and they start one stage at a time. A server wider than the inventory is
    refused with the counts."""
    (ptp, dtp), needed = SHAPES[shape]
    inventory = fake_inventory(gpus)
    cell = gpu_cell(ptp, dtp)
    if max(ptp, dtp) > gpus:
        with pytest.raises(GpuInventoryError, match=rf"needs {needed} GPUs .* has {gpus}.*TP rank"):
            _plan(cell, inventory, tmp_path)
        return
    plan = _plan(cell, inventory, tmp_path)
    sets = [tuple(int(x) for x in s.env["CUDA_VISIBLE_DEVICES"].split(",")) for s in plan.servers]
    assert [len(set(s)) for s in sets] == [ptp, dtp, dtp]
    if needed <= gpus:
        assert [g for s in sets for g in s] == list(range(needed))  # prefill, decode, baseline
        assert all(s.memory_share is None and s.start_stage == 0 for s in plan.servers)
        assert not any("--gpu-memory-utilization" in s.argv for s in plan.servers)
        return
    for gpu in range(gpus):
        on_it = [s for s, used in zip(plan.servers, sets, strict=True) if gpu in used]
        if len(on_it) < 2:
            continue
        shares = [s.memory_share for s in on_it]
        assert all(share is not None for share in shares)
        assert sum(shares) <= 0.9 + 1e-9
        assert len({s.start_stage for s in on_it}) == len(on_it), "one start at a time per GPU"
        for server in on_it:
            flag = server.argv.index("--gpu-memory-utilization")
            assert float(server.argv[flag + 1]) == server.memory_share


def test_refusal_names_servers_and_inventory_source(tmp_path):
    """A server whose TP exceeds the GPUs cannot share its way in: the error says how many GPUs
    each server needs, where the inventory came from, and that TP ranks need a GPU each."""
    inventory = fake_inventory(1)
    cell = gpu_cell(2, 1, prefill_instances=[2], decode_instances=[2])
    with pytest.raises(GpuInventoryError) as err:
        _plan(cell, inventory, tmp_path)
    msg = str(err.value)
    assert (
        "needs 7 GPUs" in msg
        and "prefill-1 2" in msg
        and "decode-1 1" in msg
        and "nvidia-smi" in msg
        and "TP rank needs a GPU of its own (prefill-0 2, prefill-1 2)" in msg
    )


def test_on_one_gpu_prefill_decode_and_baseline_share_it_and_start_in_turn(tmp_path):
    """One GPU: all three servers on GPU 0 with 0.3 of its memory each (0.9 together; vLLM's
    default 0.92 for one would leave the next no room to start), started one after another, and
    the plan's text says so."""
    inventory = fake_inventory(1)
    plan = _plan(gpu_cell(1, 1), inventory, tmp_path)
    assert [(s.name, s.gpus, s.memory_share, s.start_stage) for s in plan.servers] == [
        ("prefill-0", ("0",), 0.3, 0),
        ("decode-0", ("0",), 0.3, 1),
        ("baseline-0", ("0",), 0.3, 2),
    ]
    assert all(s.env["CUDA_VISIBLE_DEVICES"] == "0" for s in plan.servers)
    rendered = plan.render()
    assert "# decode-0: http://" in rendered
    assert "GPU 0 shared, memory share 0.3, start stage 1" in rendered
    assert "start one stage at a time" in rendered


def test_on_two_gpus_only_the_servers_that_share_one_get_a_share(tmp_path):
    """Two GPUs for three TP-1 servers: prefill and baseline share GPU 0 (0.45 each, the baseline
    second), the decoder has GPU 1 to itself and starts with the prefill."""
    inventory = fake_inventory(2)
    plan = _plan(gpu_cell(1, 1), inventory, tmp_path)
    assert [(s.name, s.gpus, s.memory_share, s.start_stage) for s in plan.servers] == [
        ("prefill-0", ("0",), 0.45, 0),
        ("decode-0", ("1",), None, 0),
        ("baseline-0", ("0",), 0.45, 1),
    ]
    assert "--gpu-memory-utilization" not in plan.decodes[0].argv


def test_a_job_plans_its_servers_with_the_shares_of_the_whole_job(tmp_path):
    """A sweep starts a PD job's decoders apart from its prefills: planned alone, on the job's one
    GPU, a decoder still gets the share and the start stage of a PD job of two servers."""
    inventory = fake_inventory(1)
    plan = _plan(
        gpu_cell(1, 1), inventory, tmp_path, roles=("decode",), job_roles=("prefill", "decode")
    )
    assert [(s.name, s.memory_share, s.start_stage) for s in plan.servers] == [
        ("decode-0", 0.45, 1)
    ]
    assert plan.proxy_port is not None


def test_a_share_from_the_serve_args_wins_and_is_checked_against_the_gpu(tmp_path):
    """A `--gpu-memory-utilization` in the model's serve args overrides pdcheck's split (the last
    word is the user's), and is what the plan shows; shares that add up to more than the GPU
    are refused (exit 3) naming the GPU and each server's share, since the last server could
    never pass vLLM's free-memory check at its start."""
    inventory = fake_inventory(1)

    def cell(share):
        return make_cell(
            model={"serve_args": ["--gpu-memory-utilization", share]},
            serving={"platform": "gpu"},
        )

    plan = _plan(cell("0.2"), inventory, tmp_path)
    assert [s.memory_share for s in plan.servers] == [0.2, 0.2, 0.2]
    for server in plan.servers:
        assert server.argv.count("--gpu-memory-utilization") == 1
        assert flag_value(server.argv, "--gpu-memory-utilization") == "0.2"
    with pytest.raises(
        ConfigError,
        match=r"sharing GPU 0 ask for prefill-0 0\.5 \+ decode-0 0\.5 \+ baseline-0 0\.5",
    ):
        _plan(cell("0.5"), inventory, tmp_path)


def test_cpu_plan_binds_cores_logs_and_urls(tmp_path):
    """On CPU at TP 1: each server's model runs in its EngineCore on its half of the cores' thread
    count (nothing bound, so the start-up imports use both cores); one log per server under logs/."""
    cell = make_cell(serving={"platform": "cpu"})
    plan = plan_topology(
        cell,
        inventory=GpuInventory((), "none"),
        ports=PortAllocator(bucket=7),
        run_dir=tmp_path,
        cpu_count=2,
    )
    assert plan.platform == "cpu"
    assert [(s.name, s.env["OMP_NUM_THREADS"]) for s in plan.servers] == [
        ("prefill-0", "1"),
        ("decode-0", "1"),
        ("baseline-0", "1"),
    ]
    assert not any("VLLM_CPU_OMP_THREADS_BIND" in s.env for s in plan.servers)
    assert [s.log_path for s in plan.servers] == [
        tmp_path / "logs" / f"{n}.log" for n in ("prefill-0", "decode-0", "baseline-0")
    ]
    assert len({s.ports.http for s in plan.servers} | {plan.proxy_port}) == 4
    rendered = plan.render()
    assert (
        "pdcheck proxy --prefill http://127.0.0.1:" in rendered
        and "VLLM_NIXL_SIDE_CHANNEL_PORT=" in rendered
    )


def test_cpu_tp2_splits_cores_per_rank(tmp_path):
    """A TP-2 decoder on 8 cores binds one core range per rank, joined by '|'."""
    cell = make_cell(matrix={"decode_tp": [2]}, serving={"platform": "cpu"})
    plan = plan_topology(
        cell,
        inventory=GpuInventory((), "none"),
        ports=PortAllocator(bucket=7),
        run_dir=tmp_path,
        cpu_count=8,
    )
    assert plan.decodes[0].env["VLLM_CPU_OMP_THREADS_BIND"] == "4-5|6-7"
    # The TP 1 prefiller runs its model in its EngineCore on its half's thread count.
    assert plan.prefills[0].env["OMP_NUM_THREADS"] == "4"
