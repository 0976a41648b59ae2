"""Every server of every shipped sweep, planned on a simulated 8-GPU machine: the flags the GPU
path needs are in its argv and env (what `pdcheck sweep --dry-run` prints); and on simulated 1-
and 2-GPU machines, where servers share GPUs."""

from __future__ import annotations

import pytest

from pdcheck.config import expand_cells, level_expectation, load_sweep
from pdcheck.config.load import SWEEPS_DIR
from pdcheck.errors import GpuInventoryError
from pdcheck.serving.plan import plan_topology
from pdcheck.serving.ports import PortAllocator
from tests.fakes.nvidia_smi import fake_inventory

SWEEPS = sorted(p.name for p in SWEEPS_DIR.glob("*.yaml"))


def _plans(name, tmp_path, gpus=8):
    inventory = fake_inventory(gpus)
    for cell in expand_cells(load_sweep(str(SWEEPS_DIR / name))):
        yield (
            cell,
            plan_topology(
                cell,
                inventory=inventory,
                ports=PortAllocator(bucket=7),
                run_dir=tmp_path / cell.dirname,
                cpu_count=2,
            ),
        )


@pytest.mark.parametrize("name", SWEEPS)
def test_shipped_sweep_servers_carry_the_gpu_path_flags(name, tmp_path):
    for cell, plan in _plans(name, tmp_path):
        for server in plan.servers:
            argv = server.argv
            assert (
                ("--async-scheduling" in argv)
                == cell.async_scheduling
                != ("--no-async-scheduling" in argv)
            ), server.name
            if cell.model.kind == "hybrid":
                assert server.env["VLLM_SSM_CONV_STATE_LAYOUT"] == "DS", (
                    f"{cell.name} {server.name}"
                )
            if cell.arm.inject is not None and server.role == "decode":
                assert (
                    "--no-enable-prefix-caching" in argv and "--enable-prefix-caching" not in argv
                )
            assert (
                "VLLM_PLUGINS" not in server.env
            )  # every installed plugin loads, pdcheck's included
        if plan.platform == "gpu":
            assert all(s.env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID" for s in plan.servers)


def test_qwen35_repro_fits_kv_at_tp1():
    """Qwen3.5-35B-A3B (~67 GiB bf16) with its default 262144 max-model-len leaves no KV room."""
    (model,) = load_sweep(str(SWEEPS_DIR / "qwen35-moe-repro.yaml")).models
    args = list(model.serve_args)
    assert int(args[args.index("--max-model-len") + 1]) <= 32768


@pytest.mark.parametrize("name", ["nixl-hybrid.yaml", "qwen35-moe-repro.yaml"])
def test_shipped_race_canaries_are_expected_only_where_the_race_can_fire(name):
    for cell in expand_cells(load_sweep(str(SWEEPS_DIR / name))):
        if not cell.arm.disable_fixes:
            continue
        for c in cell.concurrency:
            assert level_expectation(cell, c).flag == (cell.async_scheduling and c >= 2), (
                f"{cell.name} c{c}"
            )


@pytest.mark.parametrize("gpus", [1, 2])
@pytest.mark.parametrize("name", SWEEPS)
def test_shipped_sweeps_plan_on_one_or_two_gpus_by_sharing_them(name, gpus, tmp_path):
    """On 1 or 2 GPUs every cell whose servers are no wider than the GPUs plans: each server's
    ranks on distinct GPUs, every server on a GPU it shares with a memory share, the shares on
    a GPU at most 0.9 together, one start stage per server on it. A wider cell is refused."""
    cells = expand_cells(load_sweep(str(SWEEPS_DIR / name)))
    inventory = fake_inventory(gpus)
    for cell in cells:
        if max(cell.prefill_tp, cell.decode_tp) > gpus:
            with pytest.raises(GpuInventoryError, match="TP rank needs a GPU of its own"):
                plan_topology(
                    cell, inventory=inventory, ports=PortAllocator(bucket=7), run_dir=tmp_path
                )
            continue
        plan = plan_topology(
            cell, inventory=inventory, ports=PortAllocator(bucket=7), run_dir=tmp_path, cpu_count=2
        )
        if plan.platform != "gpu":
            continue
        for gpu in range(gpus):
            on_it = [s for s in plan.servers if str(gpu) in s.gpus]
            assert all(len(set(s.gpus)) == len(s.gpus) for s in on_it)
            if len(on_it) > 1:
                assert sum(s.memory_share for s in on_it) <= 0.9 + 1e-9, f"{cell.name} GPU {gpu}"
                assert len({s.start_stage for s in on_it}) == len(on_it), cell.name
