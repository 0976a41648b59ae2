"""Plan a sweep: group units by server configuration into jobs, and pack jobs onto GPUs.

Pure functions, no I/O. A *unit* is (cell, side, concurrency, repeat): one eval run. A *job*
is one topology start (a baseline server, or a PD prefill+decode+proxy) and every unit run
against it. Starting vLLM costs tens of seconds on CPU and minutes on GPU, while a unit is
often shorter, so the plan starts each distinct server configuration once:

- baseline jobs are keyed by `Cell.baseline_key()` plus the vLLM build fingerprint; cells with
  equal keys share one baseline run (the first cell owns it, the others get copies);
- PD jobs are keyed by everything that changes a PD server (not concurrency, eval or analysis);
  PD jobs that share a prefill configuration (arms that only change the decoder, such as
  injections) are placed next to each other so a runner can keep the prefiller up;
- `reuse=False` gives the restart-per-unit baseline (one job per unit), for the benchmark.

On GPUs, `pack` places jobs on disjoint GPU sets in waves that run at once; a job that needs
more GPUs than there are runs alone on all of them, its servers sharing GPUs (co-location,
`pdcheck.serving.devices`). On CPU a wave's
servers start together (a baseline job and the PD jobs after it that share a prefiller), and
each job asks at a level once the job before it is done with that level.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from pdcheck.config import Cell
from pdcheck.config.cells import SIDE_ROLES, SIDES, Side
from pdcheck.errors import GpuInventoryError

# PD jobs in one CPU wave at most (`_cpu_waves`).
_CPU_PD_JOBS_PER_WAVE = 2
# Cell fields that never change a server: they act on the client or the analysis.
_CLIENT_FIELDS = ("sweep", "concurrency", "eval", "analysis")


@dataclass(frozen=True)
class Unit:
    """One eval run: a side of a cell at one concurrency level and repeat."""

    cell_id: str
    side: Side
    concurrency: int
    repeat: int

    @property
    def run_tag(self) -> str:
        """The X-Request-Id prefix: `<side>-c<N>-r<k>-<cell id>` (evals appends `-q<index>`)."""
        return f"{self.side}-c{self.concurrency}-r{self.repeat}-{self.cell_id}"


@dataclass(frozen=True, eq=False)
class Job:
    """One topology start and the units run against it.

    `shares` are the other cells whose baseline units are copies of this job's (same key).
    """

    side: Side
    key: str
    cell: Cell
    units: tuple[Unit, ...]
    shares: tuple[Cell, ...] = ()
    prefill_key: str | None = None

    @property
    def gpus_needed(self) -> int:
        return self.cell.gpus_for(*SIDE_ROLES[self.side])

    @property
    def widest_tp(self) -> int:
        """The most GPUs one of its servers needs: each TP rank has a GPU of its own."""
        return max(self.cell.tp(role) for role in SIDE_ROLES[self.side])

    @property
    def label(self) -> str:
        return f"{self.side} {self.cell.name}"


@dataclass(frozen=True)
class Placement:
    job: Job
    gpus: tuple[int, ...]


def _digest(data: object) -> str:
    blob = json.dumps(data, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(blob.encode()).hexdigest()[:12]


def pd_server_key(cell: Cell) -> str:
    """Equal keys mean identical PD servers: model, TP, instances, async, arm switches, env, serve args."""
    data = {k: v for k, v in cell.resolved().items() if k not in _CLIENT_FIELDS}
    data["arm"] = {k: v for k, v in data["arm"].items() if k not in ("name", "canary")}
    return _digest(data)


def prefill_key(cell: Cell) -> str:
    """Like `pd_server_key` without what acts on the decoder only (injections)."""
    data = {k: v for k, v in cell.resolved().items() if k not in _CLIENT_FIELDS}
    data["arm"] = {
        k: v for k, v in data["arm"].items() if k not in ("name", "canary", "inject", "inject_seed")
    }
    return _digest(data)


def cell_units(cell: Cell, side: Side) -> tuple[Unit, ...]:
    return tuple(
        Unit(cell.id, side, c, r) for c in cell.concurrency for r in range(cell.eval.repeats)
    )


def plan_jobs(
    cells: Sequence[Cell],
    *,
    reuse: bool = True,
    build_fingerprint: Callable[[Cell], str] = lambda cell: "",
) -> list[Job]:
    """Jobs in run order: each baseline group, then its cells' PD jobs, prefill-sharing ones adjacent.

    `build_fingerprint(cell)` names the vLLM build a cell's servers run (version/commit); it
    joins the baseline key, so two builds never share a baseline.
    """
    if not reuse:
        return [
            Job(side, f"{cell.id}/{unit.side}/c{unit.concurrency}/r{unit.repeat}", cell, (unit,))
            for cell in cells
            for side in SIDES
            for unit in cell_units(cell, side)
        ]
    groups: dict[str, list[Cell]] = {}
    for cell in cells:
        groups.setdefault(f"{cell.baseline_key()}:{build_fingerprint(cell)}", []).append(cell)
    jobs: list[Job] = []
    for key, members in groups.items():
        owner = members[0]
        jobs.append(
            Job("baseline", key, owner, cell_units(owner, "baseline"), shares=tuple(members[1:]))
        )
        # Stable sort: cells keep sweep order within one prefill configuration.
        first_seen: dict[str, int] = {}
        for cell in members:
            first_seen.setdefault(prefill_key(cell), len(first_seen))
        for cell in sorted(members, key=lambda c: first_seen[prefill_key(c)]):
            jobs.append(
                Job(
                    "pd",
                    pd_server_key(cell),
                    cell,
                    cell_units(cell, "pd"),
                    prefill_key=prefill_key(cell),
                )
            )
    return jobs


def distinct_server_configs(
    cells: Sequence[Cell], *, build_fingerprint: Callable[[Cell], str] = lambda c: ""
) -> int:
    """How many different topologies the cells need: the lower bound on server starts."""
    keys = {f"b:{c.baseline_key()}:{build_fingerprint(c)}" for c in cells}
    keys |= {f"p:{pd_server_key(c)}" for c in cells}
    return len(keys)


def pack(jobs: Sequence[Job], *, gpu_indices: Sequence[int]) -> list[list[Placement]]:
    """Waves of jobs on disjoint GPU sets; the jobs of one wave may run at once.

    First fit in plan order: a job joins the earliest wave that still has enough free GPUs. A
    job that needs more GPUs than exist gets a wave and every GPU to itself, its servers sharing
    them; one whose server's TP exceeds the GPUs raises GpuInventoryError before anything starts.
    With no GPUs (CPU) jobs get no devices, and a wave is a baseline job and the PD jobs after it
    that share a prefiller (`_cpu_waves`).
    """
    if not gpu_indices:
        return _cpu_waves(jobs)
    total = len(gpu_indices)
    for job in jobs:
        if job.widest_tp > total:
            raise GpuInventoryError(
                f"{job.label} has a server at TP {job.widest_tp}, which needs {job.widest_tp} GPUs, "
                f"but only {total} are available ({', '.join(map(str, gpu_indices))}); servers can "
                "share a GPU, TP ranks cannot: exclude the cell or run on a larger node"
            )
    waves: list[list[Placement]] = []
    free: list[list[int]] = []
    for job in jobs:
        needed = min(job.gpus_needed, total)
        for wave, available in zip(waves, free, strict=True):  # noqa: B007 (the for-else uses it)
            if len(available) >= needed:
                break
        else:
            wave, available = [], list(gpu_indices)
            waves.append(wave)
            free.append(available)
        taken = tuple(available[:needed])
        del available[:needed]
        wave.append(Placement(job, taken))
    return waves


def _cpu_waves(jobs: Sequence[Job]) -> list[list[Placement]]:
    """Waves whose servers start together: a baseline job, then up to two PD jobs that share one
    prefill configuration (the first PD job after a baseline is always its group's).

    A CPU server's start is mostly one Python process importing vLLM and torch, so a server
    started alone leaves the second core idle (docs/notes/issue-20.md). The engine runs a CPU
    wave's evals one level behind the job before (`Engine._eval_turns`), so a level's baseline
    is done before a PD job asks at it (early stop pairs against it), and the second PD job's
    decoder, started with the rest, waits on the shared prefiller until the first job is done
    with a level. More PD jobs of the prefiller go in the next wave: each would hold a decoder
    idle for a whole job.
    """
    waves: list[list[Placement]] = []
    for job in jobs:
        wave = waves[-1] if waves else []
        pd_jobs = [p.job for p in wave if p.job.side == "pd"]
        joins = job.side == "pd" and (
            [p.job.side for p in wave] == ["baseline"]
            or (
                0 < len(pd_jobs) < _CPU_PD_JOBS_PER_WAVE
                and job.prefill_key is not None
                and pd_jobs[-1].prefill_key == job.prefill_key
            )
        )
        if joins:
            wave.append(Placement(job, ()))
        else:
            waves.append([Placement(job, ())])
    return waves
