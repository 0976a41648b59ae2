"""`pdcheck sweep --dry-run`: the resolved cells and the exact argv and env of every server.

Starts nothing. Each job (a baseline, or a PD topology) is planned on the GPUs the sweep plan
places it on, by the same `ServingBackend.plan` a run starts its servers from. When the arm's
python can import vLLM, each `vllm serve` argv is also run through vLLM's own argument parser
(in a subprocess of that python) and problems are listed. It also says what fetching the hub
models would download (or, offline, whether the cache holds them).
"""

from __future__ import annotations

from dataclasses import dataclass

from pdcheck.config import level_expectation
from pdcheck.config.cells import SIDE_ROLES
from pdcheck.config.schema import RaySettings
from pdcheck.sweep.judging import sizing_lines
from pdcheck.sweep.plan import Placement, pack, plan_jobs
from pdcheck.sweep.run import PreparedSweep


@dataclass(frozen=True)
class DryRun:
    text: str
    problems: tuple[str, ...]
    jobs: int


def dry_run(
    prepared: PreparedSweep,
    *,
    check_argv: bool = True,
    gpus: int | None = None,
    ray: RaySettings | None = None,
) -> DryRun:
    """`gpus`: plan for that many GPUs (indices 0..gpus-1) instead of the ones this machine has;
    `ray`: also show the placement group each job would ask a Ray cluster for."""
    from pdcheck.serving.argcheck import check_serve_argvs
    from pdcheck.serving.argv import cell_exactness, cell_python
    from pdcheck.serving.environment import probe_vllm
    from pdcheck.serving.gpus import Gpu, GpuInventory
    from pdcheck.serving.plan import resolve_platform
    from pdcheck.serving.ray_placement import group_request
    from pdcheck.serving.weights import describe_weights
    from pdcheck.sweep.serving_backend import ServingBackend

    if gpus is None:
        backend = ServingBackend.for_cells(prepared.cells)
    else:
        backend = ServingBackend(
            GpuInventory(tuple(Gpu(i, "planned") for i in range(gpus)), "--gpus")
        )
    jobs = plan_jobs(list(prepared.cells), build_fingerprint=lambda c: str(backend.provenance(c)))
    waves = pack(jobs, gpu_indices=backend.gpu_indices)
    placements: dict[str, list[Placement]] = {}
    for placement in (p for wave in waves for p in wave):
        placements.setdefault(placement.job.cell.id, []).append(placement)
    lines = [
        f"# sweep {prepared.spec.name} ({prepared.path}), {len(prepared.cells)} cells, "
        f"{len(jobs)} server starts in {len(waves)} waves; results would go to {prepared.out}"
    ]
    if ray is not None:
        lines.append(
            f"# backend: ray (address {ray.address or 'a new local instance'}, placement "
            f"{ray.placement}); each server's URL and NIXL side-channel host become its node's "
            "address, and its GPUs are the ones Ray gives it"
        )
    checked: dict[str, bool] = {}
    # Per python, one real argv per distinct command line (ports differ, the flags mostly do
    # not), and the servers that run it.
    pending: dict[str, dict[tuple[str, ...], tuple[list[str], list[str]]]] = {}
    for cell in prepared.cells:
        lines += [
            "",
            f"## {cell.name}  id {cell.id}  canary={cell.arm.canary}  concurrency={list(cell.concurrency)}",
        ]
        levels: dict[tuple[str, str], list[str]] = {}
        for c in cell.concurrency:
            expected = level_expectation(cell, c)
            levels.setdefault((expected.label, expected.why), []).append(f"c{c}")
        lines += [
            f"# {', '.join(names)}: {label} ({why})" for (label, why), names in levels.items()
        ]
        lines += [
            f"# baseline: the one of {job.cell.name} (same baseline key)"
            for job in jobs
            if job.side == "baseline" and cell in job.shares
        ]
        python = cell_python(cell)
        if check_argv and python not in checked:
            checked[python] = probe_vllm(python).vllm_version is not None
        for i, placement in enumerate(placements.get(cell.id, [])):
            plan = backend.plan(
                cell,
                roles=SIDE_ROLES[placement.job.side],
                gpus=placement.gpus,
                cell_dir=prepared.out / "cells" / cell.dirname,
            )
            if i == 0 and cell.serving.bit_exact:
                lines.append(f"# {cell_exactness(cell, platform=plan.platform).describe()}")
            if ray is not None:
                request = group_request(
                    cell,
                    roles=SIDE_ROLES[placement.job.side],
                    placement=ray.placement,
                    platform=resolve_platform(cell, backend.inventory),
                )
                lines.append(request.render())
            lines.append(plan.render())
            if not check_argv:
                continue
            if not checked[python]:
                lines.append(f"# argv not checked: {python} cannot import vllm")
                continue
            for server in plan.servers:
                _argv, users = pending.setdefault(python, {}).setdefault(
                    _without_port(server.argv), (list(server.argv), [])
                )
                users.append(f"{cell.name} {server.name}")
    lines += [
        "",
        *(f"# {line}" for line in sizing_lines(prepared.cells, family_size=prepared.family_size)),
    ]
    weights, weight_problems = describe_weights(prepared.cells)
    lines += [
        "",
        "# weights a run fetches before any server starts (Hub metadata, huggingface_hub's cache):",
        *(f"# {line}" for line in weights or ["none: fixture models and local paths only"]),
    ]
    problems: list[str] = []
    for python, argvs in pending.items():
        # One vLLM import per python for every command line it will run.
        results = check_serve_argvs([argv for argv, _ in argvs.values()], python)
        for (_, users), found in zip(argvs.values(), results, strict=True):
            problems += [f"{user}: {p}" for user in users for p in found]
    if problems:
        lines += ["", "# problems found by vLLM's argument parser:", *(f"- {p}" for p in problems)]
    return DryRun("\n".join(lines), (*weight_problems, *problems), len(jobs))


def _without_port(argv: tuple[str, ...]) -> tuple[str, ...]:
    return tuple("PORT" if i > 0 and argv[i - 1] == "--port" else a for i, a in enumerate(argv))
