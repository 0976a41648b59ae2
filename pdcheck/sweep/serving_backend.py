"""The real backend: vLLM topologies planned and started by `pdcheck.serving`.

A job runs either a cell's baseline or its PD part on the GPU set the sweep plan gave it.
`plan_topology` assigns GPUs to every role of a cell at once, so the job's GPUs are put in
the positions of the roles it starts, and placeholders (index -1, never started) in the
others.

Prefill servers outlive their job when the next PD job has the same prefill key on the same
devices (arms that change only the decoder, such as injections): a prefill start is tens of
seconds on CPU and minutes on GPU. They are held idle at most until the backend's next start
of anything else, or `close()`, so they never take cores or GPUs another job was planned on.
"""

from __future__ import annotations

import contextlib
import logging
import sys
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from pdcheck.config import Cell
from pdcheck.serving import TopologyPlan, plan_topology, serve_baseline, serve_pd, serve_prefills
from pdcheck.serving.environment import VllmEnvironment, probe_vllm
from pdcheck.serving.gpus import Gpu, GpuInventory, read_inventory
from pdcheck.serving.plan import ServerPlan, resolve_platform
from pdcheck.serving.ports import PortAllocator, default_allocator
from pdcheck.serving.process import ServerProcess
from pdcheck.sweep.backends import PdEndpoints
from pdcheck.sweep.store import Provenance

_PLACEHOLDER = Gpu(-1, "not started by this job")
log = logging.getLogger(__name__)


@dataclass
class _Prefills:
    """Running prefill servers: what they are (key), their plans, processes, and how to stop them."""

    key: tuple[str, tuple[int, ...]] | None  # None: never handed to another job
    plans: tuple[ServerPlan, ...]
    processes: tuple[ServerProcess, ...]
    stack: contextlib.ExitStack


@dataclass
class ServingBackend:
    inventory: GpuInventory
    ports: PortAllocator = field(default_factory=default_allocator)
    _environments: dict[str, VllmEnvironment] = field(default_factory=dict)
    _held: _Prefills | None = None
    _held_lock: threading.Lock = field(default_factory=threading.Lock)

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

    def plan(
        self, cell: Cell, *, cell_dir: Path, side: str | None = None, gpus: tuple[int, ...] = ()
    ) -> TopologyPlan:
        return plan_topology(
            cell,
            inventory=self._inventory_for(cell, side, gpus),
            ports=self.ports,
            run_dir=cell_dir,
        )

    def describe(self, cell: Cell, *, cell_dir: Path) -> dict[str, Any]:
        plan = self.plan(cell, cell_dir=cell_dir)
        return {
            "platform": plan.platform,
            "servers": {
                s.name: {"argv": list(s.argv), "env": s.env, "url": s.url, "log": str(s.log_path)}
                for s in plan.servers
            },
            "proxy": plan.pd_url,
            "rendered": plan.render(),
        }

    @contextlib.contextmanager
    def baseline(self, cell: Cell, *, gpus: tuple[int, ...], cell_dir: Path) -> Iterator[str]:
        plan = self.plan(cell, cell_dir=cell_dir, side="baseline", gpus=gpus)
        self._take_held(None)
        with serve_baseline(plan) as endpoints:
            yield endpoints.baseline_url

    @contextlib.contextmanager
    def pd(
        self, cell: Cell, *, gpus: tuple[int, ...], cell_dir: Path, prefill_key: str | None = None
    ) -> Iterator[PdEndpoints]:
        """`prefill_key`: jobs with equal keys may share prefill servers (None: this job's own)."""
        plan = self.plan(cell, cell_dir=cell_dir, side="pd", gpus=gpus)
        key = (
            (prefill_key, gpus[: cell.prefill_instances * cell.prefill_tp]) if prefill_key else None
        )
        prefills = self._take_held(key) or self._start_prefills(plan, key)
        try:
            plan = replace(plan, prefills=prefills.plans)
            with serve_pd(plan, prefills=prefills.processes) as endpoints:
                yield PdEndpoints(
                    endpoints.pd_url,
                    endpoints.decoder_metrics_urls,
                    plugin_dirs=tuple(s.plugin_dir for s in plan.decodes),
                    check_alive=endpoints.check_alive,
                )
        except BaseException:
            prefills.stack.close()  # a prefill may be why the job failed: never hand it on
            raise
        if key is None:
            prefills.stack.close()
        else:
            self._hold(prefills)

    def close(self) -> None:
        """Stop the prefill servers held for a next job."""
        self._take_held(None)

    def _take_held(self, key: tuple[str, tuple[int, ...]] | None) -> _Prefills | None:
        """The held prefills if their key is `key`; otherwise stop them (freeing their cores or GPUs)."""
        with self._held_lock:
            held, self._held = self._held, None
        if (
            held is not None
            and key is not None
            and held.key == key
            and all(p.is_healthy() for p in held.processes)
        ):
            log.info(
                "reusing the running prefill servers (%s)", ", ".join(p.url for p in held.processes)
            )
            return held
        if held is not None:
            held.stack.close()
        return None

    def _hold(self, prefills: _Prefills) -> None:
        """Keep `prefills` for a next job; jobs of one GPU wave end in parallel, so one held earlier stops."""
        with self._held_lock:
            previous, self._held = self._held, prefills
        if previous is not None:
            previous.stack.close()

    @staticmethod
    def _start_prefills(plan: TopologyPlan, key: tuple[str, tuple[int, ...]] | None) -> _Prefills:
        stack = contextlib.ExitStack()
        # Not waited for here: the decoders start beside them, and serve_pd waits for both.
        processes = stack.enter_context(serve_prefills(plan, wait=False))
        return _Prefills(key, plan.prefills, processes, stack)

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
