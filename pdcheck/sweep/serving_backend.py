"""The real backend: vLLM topologies planned and started by `pdcheck.serving`.

A job runs either a cell's baseline or its PD part on the GPU set the sweep plan gave it.
`plan_topology` assigns GPUs to every role of a cell at once, so the job's GPUs are put in
the positions of the roles it starts, and placeholders (index -1, never started) in the
others.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pdcheck.config import Cell
from pdcheck.serving.environment import VllmEnvironment, probe_vllm
from pdcheck.serving.gpus import Gpu, GpuInventory, read_inventory
from pdcheck.serving import TopologyPlan, plan_topology, serve_baseline, serve_pd
from pdcheck.serving.plan import resolve_platform
from pdcheck.serving.ports import PortAllocator, default_allocator
from pdcheck.sweep.backends import PdEndpoints
from pdcheck.sweep.store import Provenance

_PLACEHOLDER = Gpu(-1, "not started by this job")


@dataclass
class ServingBackend:
    inventory: GpuInventory
    ports: PortAllocator = field(default_factory=default_allocator)
    _environments: dict[str, VllmEnvironment] = field(default_factory=dict)

    @classmethod
    def for_cells(cls, cells: Sequence[Cell], *, run_dir: Path | None = None) -> ServingBackend:
        return cls(read_inventory())

    @property
    def gpu_indices(self) -> tuple[int, ...]:
        return self.inventory.indices

    def environment(self, cell: Cell) -> VllmEnvironment:
        python = (cell.environment.python if cell.environment else None) or sys.executable
        if python not in self._environments:
            self._environments[python] = probe_vllm(python)
        return self._environments[python]

    def provenance(self, cell: Cell) -> Provenance:
        env = self.environment(cell)
        return Provenance(vllm_version=env.vllm_version, vllm_commit=env.vllm_commit)

    def plan(self, cell: Cell, *, cell_dir: Path, side: str | None = None, gpus: tuple[int, ...] = ()) -> TopologyPlan:
        return plan_topology(cell, inventory=self._inventory_for(cell, side, gpus), ports=self.ports, run_dir=cell_dir)

    def describe(self, cell: Cell, *, cell_dir: Path) -> dict[str, Any]:
        plan = self.plan(cell, cell_dir=cell_dir)
        return {
            "platform": plan.platform,
            "servers": {s.name: {"argv": list(s.argv), "env": s.env, "url": s.url, "log": str(s.log_path)}
                        for s in plan.servers},
            "proxy": plan.pd_url,
            "rendered": plan.render(),
        }

    @contextlib.contextmanager
    def baseline(self, cell: Cell, *, gpus: tuple[int, ...], cell_dir: Path) -> Iterator[str]:
        plan = self.plan(cell, cell_dir=cell_dir, side="baseline", gpus=gpus)
        with serve_baseline(plan) as endpoints:
            yield endpoints.baseline_url

    @contextlib.contextmanager
    def pd(self, cell: Cell, *, gpus: tuple[int, ...], cell_dir: Path) -> Iterator[PdEndpoints]:
        plan = self.plan(cell, cell_dir=cell_dir, side="pd", gpus=gpus)
        with serve_pd(plan) as endpoints:
            yield PdEndpoints(
                endpoints.pd_url, endpoints.decoder_metrics_urls,
                plugin_dirs=tuple(s.plugin_dir for s in plan.decodes),
                check_alive=endpoints.check_alive,
            )

    def _inventory_for(self, cell: Cell, side: str | None, gpus: tuple[int, ...]) -> GpuInventory:
        if side is None or resolve_platform(cell, self.inventory) == "cpu":
            return self.inventory
        by_index = {g.index: g for g in self.inventory.gpus}
        mine = [by_index[i] for i in gpus]
        pd_count = cell.prefill_instances * cell.prefill_tp + cell.decode_instances * cell.decode_tp
        if side == "pd":
            devices = mine + [_PLACEHOLDER] * cell.decode_tp
        else:
            devices = [_PLACEHOLDER] * pd_count + mine
        return GpuInventory(tuple(devices), self.inventory.source)
