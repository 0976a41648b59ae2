"""The real backend: vLLM topologies planned and started by `pdcheck.serving`.

A job runs either a cell's baseline or its PD part on the GPU set the sweep plan gave it;
exactly those servers are planned, on exactly those devices, and the endpoints they yield
record each process as it was started.

Prefill servers outlive their job when the next PD job has the same prefill key on the same
devices (arms that change only the decoder, such as injections): a prefill start is tens of
seconds on CPU and minutes on GPU. They are held idle at most until the backend's next start
of anything else, or `close()`, so they never take cores or GPUs another job was planned on.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from pdcheck.config import Cell
from pdcheck.config.cells import SIDE_ROLES, Role
from pdcheck.serving import (
    Endpoints,
    RunningServer,
    TopologyPlan,
    cell_python,
    plan_topology,
    serve_baseline,
    serve_pd,
    serve_prefills,
)
from pdcheck.serving.environment import VllmEnvironment, probe_vllm
from pdcheck.serving.gpus import GpuInventory, read_inventory
from pdcheck.serving.plan import resolve_platform
from pdcheck.serving.ports import PortAllocator, default_allocator
from pdcheck.sweep.store import Provenance

log = logging.getLogger(__name__)

PrefillKey = tuple[str, tuple[int, ...]]


@dataclass
class _Prefills:
    """Running prefill servers: what they are (key), the servers, and how to stop them."""

    key: PrefillKey | None  # None: never handed to another job
    servers: tuple[RunningServer, ...]
    stack: contextlib.ExitStack


@dataclass
class ServingBackend:
    inventory: GpuInventory
    ports: PortAllocator = field(default_factory=default_allocator)
    # What starts `vllm` (default: per cell, `launcher_argv`); tests put a stand-in here.
    launcher: Sequence[str] | None = None
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
        python = cell_python(cell)
        if python not in self._environments:
            self._environments[python] = probe_vllm(python)
        return self._environments[python]

    def provenance(self, cell: Cell) -> Provenance:
        env = self.environment(cell)
        return Provenance(vllm_version=env.vllm_version, vllm_commit=env.vllm_commit)

    def plan(
        self, cell: Cell, *, roles: Sequence[Role], gpus: tuple[int, ...], cell_dir: Path
    ) -> TopologyPlan:
        """The servers of `roles` on the inventory's GPUs `gpus` (ignored on CPU), in that order.

        The one planning path: jobs start these plans and `--dry-run` prints them.
        """
        by_index = {g.index: g for g in self.inventory.gpus}
        return plan_topology(
            cell,
            roles=roles,
            inventory=GpuInventory(tuple(by_index[i] for i in gpus), self.inventory.source),
            platform=resolve_platform(cell, self.inventory),
            ports=self.ports,
            run_dir=cell_dir,
            launcher=self.launcher,
        )

    @contextlib.contextmanager
    def baseline(self, cell: Cell, *, gpus: tuple[int, ...], cell_dir: Path) -> Iterator[Endpoints]:
        self._take_held(None)
        plan = self.plan(cell, roles=SIDE_ROLES["baseline"], gpus=gpus, cell_dir=cell_dir)
        with serve_baseline(plan) as endpoints:
            yield endpoints

    @contextlib.contextmanager
    def pd(
        self, cell: Cell, *, gpus: tuple[int, ...], cell_dir: Path, prefill_key: str | None = None
    ) -> Iterator[Endpoints]:
        """`prefill_key`: jobs with equal keys may share prefill servers (None: this job's own)."""
        prefill_gpus, decode_gpus = split_pd_gpus(cell, gpus)
        key = (prefill_key, prefill_gpus) if prefill_key else None
        prefills = self._take_held(key)
        if prefills is None:
            plan = self.plan(cell, roles=("prefill",), gpus=prefill_gpus, cell_dir=cell_dir)
            prefills = self._start_prefills(plan, key)
        try:
            plan = self.plan(cell, roles=("decode",), gpus=decode_gpus, cell_dir=cell_dir)
            with serve_pd(plan, prefills=prefills.servers) as endpoints:
                yield endpoints
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

    def _take_held(self, key: PrefillKey | None) -> _Prefills | None:
        """The held prefills if their key is `key`; otherwise stop them (freeing their cores or GPUs)."""
        with self._held_lock:
            held, self._held = self._held, None
        if (
            held is not None
            and key is not None
            and held.key == key
            and all(s.process.is_healthy() for s in held.servers)
        ):
            log.info(
                "reusing the running prefill servers (%s)",
                ", ".join(s.process.url for s in held.servers),
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
    def _start_prefills(plan: TopologyPlan, key: PrefillKey | None) -> _Prefills:
        stack = contextlib.ExitStack()
        # Not waited for here: the decoders start beside them, and serve_pd waits for both.
        servers = stack.enter_context(serve_prefills(plan, wait=False))
        return _Prefills(key, servers, stack)


def split_pd_gpus(cell: Cell, gpus: tuple[int, ...]) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """A PD job's GPUs: the prefill servers' first, then the decoders'."""
    count = cell.gpus_for("prefill")
    return gpus[:count], gpus[count:]
