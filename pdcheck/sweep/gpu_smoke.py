"""First contact with a GPU box (`pdcheck doctor --gpu-smoke FILE`), recorded in one JSON file.

What a maintainer runs first on a new machine, before trusting a gate there. It reuses the
sweep engine on a small embedded sweep (Qwen3-0.6B, 1P1D, async on, concurrency 8, 200 GSM8K
questions; a clean arm and a zero-injection canary, each with and without
`VLLM_BATCH_INVARIANT=1`), and records (`GpuSmokeRecord`, docs/gpu-smoke.md):

- what vLLM decides on this platform for every server of that sweep (model runner, executor,
  async default, EngineCore start method, conv layout), from `create_engine_config()` as the
  dry run builds it: runs wherever the servers' vLLM runs the GPU platform (the contract tier
  runs it on the CUDA builds without a GPU);
- on a GPU box only, after the sweep ran: every server's plugin activation markers, whether a
  decoder registered its KV caches with the injection hook and whether the hook fired, and the
  measured PD/baseline discordance d of the clean arms with and without batch invariance, which
  decides the margin and mode a real gate needs. Without a GPU these parts are skipped, with the
  reason.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import msgspec
from pydantic import BaseModel, ConfigDict

from pdcheck.contracts import plugin_files
from pdcheck.contracts.vllm_programs import EngineDecisions

SCHEMA_VERSION = 1
BATCH_INVARIANT = "VLLM_BATCH_INVARIANT"
SMOKE_SWEEP = f"""\
schema_version: 1
name: gpu-smoke
description: First contact - Qwen3-0.6B 1P1D, clean and zero-injection, with and without batch invariance.
expected_gpu_hours: 0.2
models:
  - name: qwen3-0.6b
    path: Qwen/Qwen3-0.6B
    kind: full-attention
matrix:
  async_scheduling: [true]
  arms: [fixes-on, inject-zero]
  concurrency: [8]
  env: [{{}}, {{{BATCH_INVARIANT}: "1"}}]
eval:
  task: gsm8k
  limit: 200
  logprobs: true
serving:
  platform: gpu
"""


class _Record(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Part(_Record):
    """One part of the record: what it found, or why it did not run."""

    status: Literal["ran", "skipped", "failed"]
    reason: str | None = None


class ServerDecisions(_Record):
    server: str  # "<cell> <server>", comma-joined when servers share one check
    decisions: dict  # pdcheck.contracts.vllm_programs.EngineDecisions, field for field


class DecisionsPart(Part):
    servers: list[ServerDecisions] = []
    problems: list[str] = []


class ServerEvidence(_Record):
    cell: str
    server: str  # role-index, e.g. decode-0
    markers: list[dict]  # each activation-<pid>.json as the plugin wrote it
    kv_registered_with_hook: bool  # a process registered NIXL KV caches with the hook in place
    injections: int  # lines of the injections log: the hook fired this many times


class ServersPart(Part):
    servers: list[ServerEvidence] = []


class Discordance(_Record):
    cell: str
    batch_invariant: bool
    concurrency: int
    pairs: int | None
    d: float | None  # the share of questions PD and the baseline disagree on
    verdict: str


class DiscordancePart(Part):
    clean: list[Discordance] = []


class GpuSmokeRecord(_Record):
    schema_version: int = SCHEMA_VERSION
    pdcheck_version: str
    environment: dict  # pdcheck.serving.environment.collect_environment()
    decisions: DecisionsPart
    servers: ServersPart
    discordance: DiscordancePart


def _decisions(checks: dict, problems: tuple[str, ...]) -> DecisionsPart:
    built = [
        ServerDecisions(server=users, decisions=_as_dict(c.decisions))
        for users, c in checks.items()
        if c.decisions is not None
    ]
    reasons = sorted({c.not_built for c in checks.values() if c.not_built})
    if problems:
        return DecisionsPart(status="failed", servers=built, problems=list(problems))
    if not built:
        return DecisionsPart(status="skipped", reason="; ".join(reasons) or "no server was checked")
    return DecisionsPart(status="ran", servers=built)


def _as_dict(decisions: EngineDecisions) -> dict:
    from dataclasses import asdict

    return asdict(decisions)


def _server_evidence(run_root: Path) -> list[ServerEvidence]:
    evidence = []
    for plugin_dir in sorted(run_root.glob("cells/*/plugin/*")):
        markers = plugin_files.read_activation_markers(plugin_dir)
        injections = plugin_dir / plugin_files.INJECTIONS_FILE
        evidence.append(
            ServerEvidence(
                cell=plugin_dir.parent.parent.name,
                server=plugin_dir.name,
                markers=[msgspec.to_builtins(m) for m in markers],
                kv_registered_with_hook=any(
                    plugin_files.KV_LOAD_HOOK_WITH_KV_CACHES in m.did for m in markers
                ),
                injections=len(injections.read_text().splitlines()) if injections.exists() else 0,
            )
        )
    return evidence


def _discordance(run_root: Path, batch_invariant_cells: set[str]) -> list[Discordance]:
    from pdcheck.report.rows import build_rows
    from pdcheck.results import load_run

    return [
        Discordance(
            cell=row.cell,
            batch_invariant=row.cell_id in batch_invariant_cells,
            concurrency=row.concurrency,
            pairs=row.n,
            d=row.discordance,
            verdict=str(row.verdict),
        )
        for row in build_rows(load_run(run_root))
        if row.arm == "fixes-on"
    ]


def run_gpu_smoke(work_dir: Path) -> GpuSmokeRecord:
    """The whole first contact, its sweep's files under `work_dir`; never raises for a part that
    could not run (the part says why)."""
    from pdcheck import __version__
    from pdcheck.serving.environment import collect_environment
    from pdcheck.serving.gpus import read_inventory
    from pdcheck.sweep.dryrun import dry_run
    from pdcheck.sweep.run import SweepRequest, prepare, run_sweep

    work_dir.mkdir(parents=True, exist_ok=True)
    sweep_file = work_dir / "gpu-smoke.yaml"
    sweep_file.write_text(SMOKE_SWEEP)
    request = SweepRequest(file=str(sweep_file), out=work_dir / "run")
    prepared = prepare(request)
    gpus = read_inventory().count
    # Planned on three GPUs (a baseline, a prefiller, a decoder), whatever this box has: the
    # decisions do not depend on which GPU a TP 1 server gets.
    planned = dry_run(prepared, gpus=3)
    decisions = _decisions(planned.checks, planned.problems)
    if gpus == 0:
        why = "no NVIDIA GPU here (nvidia-smi lists none): servers and the measured d need one"
        servers = ServersPart(status="skipped", reason=why)
        discordance = DiscordancePart(status="skipped", reason=why)
    else:
        try:
            result = run_sweep(request)
        except Exception as exc:  # the record says what failed; the sweep's own logs say more
            why = f"the smoke sweep failed: {type(exc).__name__}: {exc}"
            servers = ServersPart(status="failed", reason=why)
            discordance = DiscordancePart(status="failed", reason=why)
        else:
            invariant = {c.id for c in prepared.cells if c.env.get(BATCH_INVARIANT) == "1"}
            servers = ServersPart(status="ran", servers=_server_evidence(result.root))
            discordance = DiscordancePart(status="ran", clean=_discordance(result.root, invariant))
    return GpuSmokeRecord(
        pdcheck_version=__version__,
        environment=collect_environment(),
        decisions=decisions,
        servers=servers,
        discordance=discordance,
    )


def write_gpu_smoke(out: Path) -> GpuSmokeRecord:
    record = run_gpu_smoke(out.parent / f"{out.stem}-work")
    out.write_text(record.model_dump_json(indent=2) + "\n")
    return record
