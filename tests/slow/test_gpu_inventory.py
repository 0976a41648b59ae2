"""The GPU inventory as `read_inventory` reads it from a fake nvidia-smi, narrowed by
CUDA_VISIBLE_DEVICES, and the plans made on it. (Moved from tests/unit/serving/test_plan.py:
each test runs the fake nvidia-smi, a child python; the unit tier plans on `fake_inventory`.)"""

from __future__ import annotations

import pytest

from pdcheck.errors import ConfigError
from pdcheck.serving.gpus import read_inventory
from pdcheck.serving.plan import plan_topology
from pdcheck.serving.ports import PortAllocator
from tests.fakes.nvidia_smi import fake_inventory, fake_nvidia_smi, fake_uuid
from tests.unit.serving.conftest import gpu_cell


def test_the_unit_tiers_inventory_is_what_nvidia_smi_reports(tmp_path):
    """`fake_inventory(n)`, which the unit tier plans on, equals what `read_inventory` reads from
    the fake nvidia-smi of n GPUs with no CUDA_VISIBLE_DEVICES, so those plans are the real ones."""
    for count in (1, 2, 8):
        read = read_inventory(env={}, nvidia_smi=fake_nvidia_smi(tmp_path, count))
        assert read == fake_inventory(count) and read.count == count


def test_cuda_visible_devices_narrows_the_inventory(tmp_path):
    """With CUDA_VISIBLE_DEVICES=4,5,6,7 the servers get those GPUs, not 0-3."""
    inventory = read_inventory(
        env={"CUDA_VISIBLE_DEVICES": "4,5,6,7"}, nvidia_smi=fake_nvidia_smi(tmp_path, 8)
    )
    plan = plan_topology(
        gpu_cell(2, 1), inventory=inventory, ports=PortAllocator(bucket=7), run_dir=tmp_path
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
        gpu_cell(2, 1), inventory=inventory, ports=PortAllocator(bucket=7), run_dir=tmp_path
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
