"""`pdcheck sweep --dry-run`: the resolved cells and the exact argv and env of every server.

Starts nothing. Each job (a baseline, or a PD topology) is planned on the GPUs the sweep plan
places it on, by the same `ServingBackend.plan` a run starts its servers from. When the arm's
python can import vLLM, each `vllm serve` argv is also run through vLLM's own argument parser
(in a subprocess of that python), and for a GPU sweep whose vLLM there runs the GPU platform,
each server's engine config is built from its argv and environment as `vllm serve` builds it,
so conflicts that show only then are listed before any GPU is held, with what vLLM decided for
each server. It also says what fetching the hub models would download (or, offline, whether the
cache holds them).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from pdcheck.config import level_expectation
from pdcheck.config.cells import SIDE_ROLES
from pdcheck.config.schema import RaySettings
from pdcheck.contracts import environment
from pdcheck.contracts.vllm_programs import EngineDecisions, ServeCheck
from pdcheck.sweep.edges import coverage_line
from pdcheck.sweep.judging import sizing_lines
from pdcheck.sweep.plan import Placement, pack, plan_jobs
from pdcheck.sweep.run import PreparedSweep

ServerPlanLike = tuple[tuple[str, ...], dict[str, str]]


# The device type vLLM reports for the platforms whose servers' engine configs the dry run
# builds: GPU only, where a conflict found now frees GPUs a failed start would hold. A CPU
# sweep's argvs are parsed only (building its configs tripled cpu-smoke's dry run, 42 s to
# 121 s; docs/notes/issue-31.md).
DEVICE_TYPES = {"gpu": "cuda"}


@dataclass(frozen=True)
class DryRun:
    text: str
    problems: tuple[str, ...]
    jobs: int
    # Per distinct server (its users, "<cell> <server>", comma-joined): what vLLM answered.
    checks: dict[str, ServeCheck] = field(default_factory=dict)


def dry_run(
    prepared: PreparedSweep,
    *,
    check_argv: bool = True,
    gpus: int | None = None,
    ray: RaySettings | None = None,
) -> DryRun:
    """`gpus`: plan for that many GPUs (indices 0..gpus-1) instead of the ones this machine has;
    `ray`: also show the placement group each job would ask a Ray cluster for."""
    from pdcheck.serving.argcheck import check_servers
    from pdcheck.serving.argv import cell_exactness, cell_python
    from pdcheck.serving.environment import probe_vllm
    from pdcheck.serving.gpus import Gpu, GpuInventory
    from pdcheck.serving.plan import resolve_platform
    from pdcheck.serving.queueing import queueing_lines
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
    # Per python and platform, one real server per distinct command line and environment (ports
    # and plugin folders differ, the rest mostly does not), and the servers that run it.
    pending: dict[tuple[str, str | None], dict[tuple, tuple[ServerPlanLike, list[str]]]] = {}
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
        lines.append(f"# {coverage_line(cell)}")
        platform = resolve_platform(cell, backend.inventory)
        lines += [f"# {line}" for line in queueing_lines(cell, platform=platform)]
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
            device_type = DEVICE_TYPES.get(plan.platform)
            for server in plan.servers:
                _server, users = pending.setdefault((python, device_type), {}).setdefault(
                    _check_key(server.argv, server.env), ((server.argv, server.env), [])
                )
                users.append(f"{cell.dirname} {server.name}")
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
    checks: dict[str, ServeCheck] = {}
    for (python, device_type), servers in pending.items():
        # One vLLM import per python for every server it will run.
        results = check_servers(
            [server for server, _ in servers.values()], python, device_type=device_type
        )
        for (_, users), found in zip(servers.values(), results, strict=True):
            problems += [f"{user}: {p}" for user in users for p in found.problems]
            checks[", ".join(users)] = found
    if problems:
        lines += ["", "# problems found by vLLM:", *(f"- {p}" for p in problems)]
    lines += _decision_lines(checks)
    return DryRun("\n".join(lines), (*weight_problems, *problems), len(jobs), checks)


def _decision_lines(checks: dict[str, ServeCheck]) -> list[str]:
    built = {users: c.decisions for users, c in checks.items() if c.decisions is not None}
    not_built = sorted({c.not_built for c in checks.values() if c.not_built})
    lines = [f"# engine config not built: {reason}" for reason in not_built]
    if built:
        lines += ["", "# what vLLM decided in building each server's engine config:"]
        lines += [f"# {users}: {_describe(d)}" for users, d in built.items()]
    return ["", *lines] if not_built else lines


def _describe(d: EngineDecisions) -> str:
    parts = [
        f"{d.model_runner} model runner",
        f"{d.executor_backend} executor",
        f"async scheduling {'on' if d.async_scheduling else 'off'}",
        f"EngineCore {d.start_method}",
        f"max-model-len {d.max_model_len}",
    ]
    if d.conv_state_layout:
        parts.append(f"conv state {d.conv_state_layout}")
    if d.kv_connector:
        parts.append(f"{d.kv_connector} {d.kv_role}")
    return ", ".join(parts)


# Variables that differ between servers without changing what vLLM builds.
_PER_SERVER_VARS = frozenset(
    var.name
    for var in (
        environment.VLLM_PORT,
        environment.NIXL_SIDE_CHANNEL_PORT,
        environment.PLUGIN_DIR,
        environment.TRACE_DIR,
    )
)


def _check_key(argv: tuple[str, ...], env: dict[str, str]) -> tuple:
    """What decides a server's check: its argv less the port, its environment less its ports,
    plugin folders and which GPUs (but how many) it gets."""
    args = tuple("PORT" if i > 0 and argv[i - 1] == "--port" else a for i, a in enumerate(argv))
    kept = []
    for name, value in sorted(env.items()):
        if name == "CUDA_VISIBLE_DEVICES":
            kept.append((name, str(len(value.split(",")))))
        elif name not in _PER_SERVER_VARS:
            kept.append((name, value))
    return args, tuple(kept)
