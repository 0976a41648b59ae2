"""`run_race`: run workload variants over seeds against the installed vLLM and summarise the findings.

Imports vLLM inside the call (6-20 s), never at module import. Each seed builds a fresh scheduler
inside the requested fix switches and mutation, so patches apply to exactly the runs asked for.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import statistics
import time
from collections import Counter
from collections.abc import Callable, Iterable
from typing import Any

from pdcheck.contracts.fixes import FixStatus, statuses_from_record
from pdcheck.errors import ExitCode, HarnessError, PdcheckError
from pdcheck.race.findings import Family, Finding
from pdcheck.race.workload import DEFAULT_VARIANTS, Workload, get_variant

logger = logging.getLogger(__name__)
SCHEMA_VERSION = 1
EXAMPLES_PER_VARIANT = 3


@dataclasses.dataclass(frozen=True)
class SeedResult:
    """One seed of one variant."""

    variant: str
    seed: int
    steps: int
    sim_s: float
    num_findings: int
    num_propagated: int  # findings that reached their victim through the prefix cache
    kind_counts: dict[str, int]
    first_step_by_family: dict[str, int]
    findings: tuple[Finding, ...]  # the first ones, with reproducers


@dataclasses.dataclass(frozen=True)
class VariantResult:
    """All seeds of one variant: how many found something, how early, how fast."""

    variant: str
    seeds: int
    seeds_with_findings: int
    seeds_by_family: dict[str, int]
    median_first_step_by_family: dict[str, float]
    findings_by_kind: dict[str, int]
    propagated_findings: int
    steps: int
    sim_s: float
    examples: tuple[Finding, ...]
    # Why this vLLM cannot run the variant (then seeds == 0), or None.
    unsupported: str | None = None

    @property
    def steps_per_s(self) -> float:
        return self.steps / self.sim_s if self.sim_s > 0 else 0.0

    @property
    def median_first_step(self) -> float | None:
        values = list(self.median_first_step_by_family.values())
        return min(values) if values else None

    def to_dict(self) -> dict[str, Any]:
        return {
            "variant": self.variant,
            "seeds": self.seeds,
            "seeds_with_findings": self.seeds_with_findings,
            "seeds_by_family": self.seeds_by_family,
            "median_first_step_by_family": self.median_first_step_by_family,
            "findings_by_kind": self.findings_by_kind,
            "propagated_findings": self.propagated_findings,
            "steps": self.steps,
            "sim_s": round(self.sim_s, 4),
            "steps_per_s": round(self.steps_per_s, 1),
            "examples": [f.to_dict() for f in self.examples],
            "unsupported": self.unsupported,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> VariantResult:
        return cls(
            variant=data["variant"],
            seeds=data["seeds"],
            seeds_with_findings=data["seeds_with_findings"],
            seeds_by_family=dict(data["seeds_by_family"]),
            median_first_step_by_family=dict(data["median_first_step_by_family"]),
            findings_by_kind=dict(data["findings_by_kind"]),
            propagated_findings=data["propagated_findings"],
            steps=data["steps"],
            sim_s=data["sim_s"],
            examples=tuple(Finding.from_dict(f) for f in data["examples"]),
            unsupported=data.get("unsupported"),
        )


@dataclasses.dataclass(frozen=True)
class RaceSummary:
    """What `pdcheck race` reports: per variant results plus the vLLM and switches they ran against."""

    vllm_version: str
    disabled_fixes: tuple[str, ...]  # switches actually applied
    fixes_absent: tuple[str, ...]  # fixes this vLLM lacks (their switches are no-ops)
    mutation: str | None
    seeds: int
    seed_start: int
    requests: int
    depth: int | None
    variants: tuple[VariantResult, ...]
    # Each fix's status in this vLLM, with its form (pdcheck.contracts.fixes).
    fixes: dict[str, FixStatus] = dataclasses.field(default_factory=dict)

    @property
    def has_findings(self) -> bool:
        return any(v.seeds_with_findings for v in self.variants)

    @property
    def exit_code(self) -> ExitCode:
        return ExitCode.FAILED if self.has_findings else ExitCode.OK

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema_version": SCHEMA_VERSION,
            "vllm_version": self.vllm_version,
            "disabled_fixes": list(self.disabled_fixes),
            "fixes_absent": list(self.fixes_absent),
            "fixes": {fix: status.to_dict() for fix, status in self.fixes.items()},
            "mutation": self.mutation,
            "seeds": self.seeds,
            "seed_start": self.seed_start,
            "requests": self.requests,
            "depth": self.depth,
            "has_findings": self.has_findings,
            "variants": [v.to_dict() for v in self.variants],
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RaceSummary:
        return cls(
            vllm_version=data["vllm_version"],
            disabled_fixes=tuple(data["disabled_fixes"]),
            fixes_absent=tuple(data["fixes_absent"]),
            mutation=data["mutation"],
            fixes=statuses_from_record(data.get("fixes")),
            seeds=data["seeds"],
            seed_start=data["seed_start"],
            requests=data["requests"],
            depth=data["depth"],
            variants=tuple(VariantResult.from_dict(v) for v in data["variants"]),
        )


def prepare_vllm() -> None:
    """Import vLLM, check every internal the harness needs (VllmIncompatible lists what is missing), quiet its logs."""
    from pdcheck._vllm import internals

    internals.check_internals()
    internals.quiet_vllm_logs()


def run_seed(workload: Workload, seed: int, *, replay_options: str = "") -> SeedResult:
    """One deterministic run: a fresh scheduler (built under whatever patches are active) and one RaceSim."""
    from pdcheck._vllm.sim_scheduler import SimScheduler
    from pdcheck.race.sim import RaceSim

    scheduler = SimScheduler(workload.scheduler)
    sim = RaceSim(workload, seed, scheduler, replay_options=replay_options)
    t0 = time.perf_counter()
    findings = sim.run()
    sim_s = time.perf_counter() - t0
    # Every finding's family, not only the kept ones': a family first seen after the first
    # MAX_FINDINGS_KEPT findings still counts for its seed.
    first = dict(sim.first_step_by_family)
    return SeedResult(
        workload.name,
        seed,
        sim.dispatched,
        sim_s,
        sim.num_findings,
        sim.num_propagated,
        dict(sim.kind_counts),
        first,
        tuple(findings),
    )


def unsupported_variant(workload: Workload) -> str | None:
    """Why the installed vLLM cannot run ``workload`` faithfully, or None (pdcheck._vllm.versions)."""
    from pdcheck._vllm import versions

    spec = workload.scheduler
    if spec.layout != "hybrid":
        return None
    if spec.mamba_mode == "align" and (reason := versions.mamba_align_connector_unsupported()):
        return reason
    if workload.load_failure_rate > 0:
        return versions.hybrid_load_failure_unsupported()
    return None


def _unsupported_result(name: str, reason: str) -> VariantResult:
    return VariantResult(name, 0, 0, {}, {}, {}, 0, 0, 0.0, (), unsupported=reason)


def summarize_variant(name: str, results: list[SeedResult]) -> VariantResult:
    by_family: dict[str, list[int]] = {}
    kinds: Counter[str] = Counter()
    examples: list[Finding] = []
    for r in results:
        for family, step in r.first_step_by_family.items():
            by_family.setdefault(family, []).append(step)
        kinds.update(r.kind_counts)
        if r.findings and len(examples) < EXAMPLES_PER_VARIANT:
            examples.append(min(r.findings, key=lambda f: f.step))
    return VariantResult(
        variant=name,
        seeds=len(results),
        seeds_with_findings=sum(1 for r in results if r.num_findings),
        seeds_by_family={f: len(v) for f, v in sorted(by_family.items())},
        median_first_step_by_family={
            f: float(statistics.median(v)) for f, v in sorted(by_family.items())
        },
        findings_by_kind=dict(sorted(kinds.items())),
        propagated_findings=sum(r.num_propagated for r in results),
        steps=sum(r.steps for r in results),
        sim_s=sum(r.sim_s for r in results),
        examples=tuple(examples),
    )


def run_race(
    *,
    seeds: int = 20,
    seed_start: int = 0,
    requests: int = 300,
    variants: Iterable[str] = DEFAULT_VARIANTS,
    disable_fixes: Iterable[str] = (),
    depth: int | None = None,
    mutation: str | None = None,
    trace_dir: str | None = None,
    on_seed: Callable[[SeedResult], None] | None = None,
) -> RaceSummary:
    """Run every variant over seeds [seed_start, seed_start + seeds); raises HarnessError if it cannot run."""
    from pdcheck.vllm_plugin import switches

    workloads = [get_variant(v) for v in variants]
    fixes = switches.parse_fixes(list(disable_fixes))
    overrides: dict[str, Any] = {"requests": requests}
    if depth is not None:
        overrides["depth"] = depth
    workloads = [w.with_overrides(**overrides) for w in workloads]
    try:
        from pdcheck._vllm import internals, mutations, versions

        prepare_vllm()
        if mutation is not None and mutation not in mutations.MUTATIONS:
            raise HarnessError(
                f"unknown mutation {mutation!r}; allowed: {', '.join(mutations.MUTATIONS)}"
            )
        results = []
        with contextlib.ExitStack() as stack:
            applied = stack.enter_context(switches.disable_fixes(fixes))
            if mutation is not None:
                stack.enter_context(mutations.apply_mutation(mutation))
            if trace_dir is not None:
                from pdcheck.vllm_plugin.trace_recorder import recording

                stack.enter_context(recording(trace_dir))
            options = " ".join(
                [f"--requests {requests}"]
                + [f"--disable-fix {f}" for f in fixes]
                + ([f"--depth {depth}"] if depth is not None else [])
                + ([f"--mutation {mutation}"] if mutation else [])
            )
            for workload in workloads:
                reason = unsupported_variant(workload)
                if reason is not None:
                    logger.warning("race variant %s cannot run: %s", workload.name, reason)
                    results.append(_unsupported_result(workload.name, reason))
                    continue
                per_seed = []
                for seed in range(seed_start, seed_start + seeds):
                    result = run_seed(workload, seed, replay_options=options)
                    per_seed.append(result)
                    if on_seed is not None:
                        on_seed(result)
                results.append(summarize_variant(workload.name, per_seed))
                logger.info(
                    "race variant %s: %d/%d seeds with findings",
                    workload.name,
                    results[-1].seeds_with_findings,
                    seeds,
                )
        statuses = versions.fix_statuses()
        absent = tuple(f for f, status in statuses.items() if status.state == "absent")
        return RaceSummary(
            vllm_version=internals.vllm_version(),
            disabled_fixes=tuple(applied),
            fixes_absent=absent,
            mutation=mutation,
            seeds=seeds,
            seed_start=seed_start,
            requests=requests,
            depth=depth,
            variants=tuple(results),
            fixes=statuses,
        )
    except PdcheckError:
        raise
    except Exception as exc:  # the harness itself broke: exit 2, never a clean pass
        raise HarnessError(f"race harness could not run: {type(exc).__name__}: {exc}") from exc


__all__ = ["Family", "RaceSummary", "SeedResult", "VariantResult", "run_race", "run_seed"]
