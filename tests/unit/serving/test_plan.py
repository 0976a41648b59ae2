"""Topology plans: GPU sets from a simulated nvidia-smi, CPU core binding, refusal before start."""

from __future__ import annotations

import pytest

from pdcheck.errors import ConfigError, GpuInventoryError
from pdcheck.serving.argv import flag_value
from pdcheck.serving.gpus import read_inventory
from pdcheck.serving.plan import plan_topology
from pdcheck.serving.ports import PortAllocator
from tests.fakes.nvidia_smi import fake_nvidia_smi, fake_uuid
from tests.unit.serving.conftest import make_cell

# (prefill TP, decode TP) -> GPUs for PD plus a baseline at the decode TP
SHAPES = {"P2/D2": ((2, 2), 6), "P1/D2": ((1, 2), 5), "P2/D1": ((2, 1), 4)}


def _cell(ptp: int, dtp: int, **matrix):
    return make_cell(
        matrix={"prefill_tp": [ptp], "decode_tp": [dtp], **matrix}, serving={"platform": "gpu"}
    )


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
    inventory = read_inventory(env={}, nvidia_smi=fake_nvidia_smi(tmp_path, gpus))
    assert inventory.count == gpus
    cell = _cell(ptp, dtp)
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
    inventory = read_inventory(env={}, nvidia_smi=fake_nvidia_smi(tmp_path, 1))
    cell = _cell(2, 1, prefill_instances=[2], decode_instances=[2])
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
    inventory = read_inventory(env={}, nvidia_smi=fake_nvidia_smi(tmp_path, 1))
    plan = _plan(_cell(1, 1), inventory, tmp_path)
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
    inventory = read_inventory(env={}, nvidia_smi=fake_nvidia_smi(tmp_path, 2))
    plan = _plan(_cell(1, 1), inventory, tmp_path)
    assert [(s.name, s.gpus, s.memory_share, s.start_stage) for s in plan.servers] == [
        ("prefill-0", ("0",), 0.45, 0),
        ("decode-0", ("1",), None, 0),
        ("baseline-0", ("0",), 0.45, 1),
    ]
    assert "--gpu-memory-utilization" not in plan.decodes[0].argv


def test_a_job_plans_its_servers_with_the_shares_of_the_whole_job(tmp_path):
    """A sweep starts a PD job's decoders apart from its prefills: planned alone, on the job's one
    GPU, a decoder still gets the share and the start stage of a PD job of two servers."""
    inventory = read_inventory(env={}, nvidia_smi=fake_nvidia_smi(tmp_path, 1))
    plan = _plan(
        _cell(1, 1), inventory, tmp_path, roles=("decode",), job_roles=("prefill", "decode")
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
    inventory = read_inventory(env={}, nvidia_smi=fake_nvidia_smi(tmp_path, 1))

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


def test_cuda_visible_devices_narrows_the_inventory(tmp_path):
    """With CUDA_VISIBLE_DEVICES=4,5,6,7 the servers get those GPUs, not 0-3."""
    inventory = read_inventory(
        env={"CUDA_VISIBLE_DEVICES": "4,5,6,7"}, nvidia_smi=fake_nvidia_smi(tmp_path, 8)
    )
    plan = plan_topology(
        _cell(2, 1), inventory=inventory, ports=PortAllocator(bucket=7), run_dir=tmp_path
    )
    assert [s.env["CUDA_VISIBLE_DEVICES"] for s in plan.servers] == ["4,5", "6", "7"]


def test_cuda_visible_devices_by_uuid_or_mig_id_are_kept_and_handed_on_by_that_name(tmp_path):
    """UUIDs and MIG ids in CUDA_VISIBLE_DEVICES are devices too; each server gets them as named,
    with CUDA_DEVICE_ORDER=PCI_BUS_ID so CUDA's indices are nvidia-smi's."""
    visible = f"{fake_uuid(5)},{fake_uuid(2)},MIG-3f1c2a7e-0000-0000-0000-000000000001,7"
    inventory = read_inventory(
        env={"CUDA_VISIBLE_DEVICES": visible}, nvidia_smi=fake_nvidia_smi(tmp_path, 8)
    )
    assert [g.device for g in inventory.gpus] == visible.split(",")
    assert len(set(inventory.indices)) == 4 and inventory.indices[:2] == (5, 2)
    plan = plan_topology(
        _cell(2, 1), inventory=inventory, ports=PortAllocator(bucket=7), run_dir=tmp_path
    )
    assert [s.env["CUDA_VISIBLE_DEVICES"] for s in plan.servers] == [
        ",".join(visible.split(",")[:2]),
        *visible.split(",")[2:],
    ]
    assert all(s.env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID" for s in plan.servers)
    without_smi = read_inventory(
        env={"CUDA_VISIBLE_DEVICES": visible}, nvidia_smi=str(tmp_path / "none")
    )
    assert [g.device for g in without_smi.gpus] == visible.split(",")


def test_cpu_plan_binds_cores_logs_and_urls(tmp_path):
    """On CPU at TP 1: each server's model runs in its EngineCore on its half of the cores' thread
    count (nothing bound, so the start-up imports use both cores); one log per server under logs/."""
    cell = make_cell(serving={"platform": "cpu"})
    plan = plan_topology(
        cell,
        inventory=read_inventory(env={}, nvidia_smi=str(tmp_path / "none")),
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
        inventory=read_inventory(env={}, nvidia_smi=str(tmp_path / "none")),
        ports=PortAllocator(bucket=7),
        run_dir=tmp_path,
        cpu_count=8,
    )
    assert plan.decodes[0].env["VLLM_CPU_OMP_THREADS_BIND"] == "4-5|6-7"
    # The TP 1 prefiller runs its model in its EngineCore on its half's thread count.
    assert plan.prefills[0].env["OMP_NUM_THREADS"] == "4"


@pytest.mark.parametrize(
    "visible", ["0,0,0", f"1,{fake_uuid(1)}"], ids=["index twice", "index and uuid"]
)
def test_a_gpu_named_twice_is_refused_naming_co_location(tmp_path, visible):
    """CUDA_VISIBLE_DEVICES naming one GPU twice (by index, or by index and UUID) would put
    several servers on it at vLLM's default memory share: refused (exit 3), saying so."""
    with pytest.raises(
        ConfigError, match=r"names GPU 1 more than once|names GPU 0 more than once"
    ) as err:
        read_inventory(
            env={"CUDA_VISIBLE_DEVICES": visible}, nvidia_smi=fake_nvidia_smi(tmp_path, 4)
        )
    assert "co-location" in str(err.value)
    with pytest.raises(ConfigError, match="more than once"):  # no nvidia-smi: the names alone
        read_inventory(env={"CUDA_VISIBLE_DEVICES": "0,0"}, nvidia_smi=str(tmp_path / "none"))
