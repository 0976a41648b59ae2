"""Topology plans: GPU sets from a simulated nvidia-smi, CPU core binding, refusal before start."""

from __future__ import annotations

import pytest

from pdcheck.errors import ConfigError, GpuInventoryError
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


@pytest.mark.parametrize("gpus", [1, 2, 4, 8])
@pytest.mark.parametrize("shape", list(SHAPES))
def test_gpu_sets_are_disjoint_contiguous_or_refused(tmp_path, gpus, shape):
    """Each server gets a disjoint contiguous CUDA_VISIBLE_DEVICES run; too few GPUs → refused with counts."""
    (ptp, dtp), needed = SHAPES[shape]
    inventory = read_inventory(env={}, nvidia_smi=fake_nvidia_smi(tmp_path, gpus))
    assert inventory.count == gpus
    cell = _cell(ptp, dtp)
    if needed > gpus:
        with pytest.raises(GpuInventoryError, match=rf"needs {needed} GPUs .* has {gpus}"):
            plan_topology(
                cell, inventory=inventory, ports=PortAllocator(bucket=7), run_dir=tmp_path
            )
        return
    plan = plan_topology(cell, inventory=inventory, ports=PortAllocator(bucket=7), run_dir=tmp_path)
    sets = [tuple(int(x) for x in s.env["CUDA_VISIBLE_DEVICES"].split(",")) for s in plan.servers]
    assert [len(s) for s in sets] == [ptp, dtp, dtp]
    flat = [g for s in sets for g in s]
    assert flat == list(range(needed))  # contiguous, in order: prefill, decode, baseline


def test_refusal_names_servers_and_inventory_source(tmp_path):
    """The error says how many GPUs each server needs and where the inventory came from."""
    inventory = read_inventory(env={}, nvidia_smi=fake_nvidia_smi(tmp_path, 4))
    cell = _cell(2, 2, prefill_instances=[2], decode_instances=[2])
    with pytest.raises(GpuInventoryError) as err:
        plan_topology(cell, inventory=inventory, ports=PortAllocator(bucket=7), run_dir=tmp_path)
    msg = str(err.value)
    assert (
        "needs 10 GPUs" in msg
        and "prefill-1 2" in msg
        and "decode-1 2" in msg
        and "nvidia-smi" in msg
    )


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
