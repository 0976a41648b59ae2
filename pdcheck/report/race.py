"""The race-findings section: the harness's results, attribution across arms, injection precision.

All three come from the store: the harness's JSON (`race/summary.json`, with `pdcheck race
--json` under `result`), the attribution the sweep derives from the stored verdicts
(`pdcheck.results.summary.attribution`, rules in docs/analysis.md), and the injection precision
stored with each injected arm's verdict.
"""

from __future__ import annotations

from dataclasses import dataclass

from pdcheck.analysis.attribution import Attribution
from pdcheck.analysis.injection import InjectionPrecision
from pdcheck.report.sections import table
from pdcheck.results.load import RunResults
from pdcheck.results.schema import RaceOutcome
from pdcheck.results.summary import run_summary

__all__ = ["InjectionResult", "attributions", "injection_results", "race_sections"]


@dataclass(frozen=True)
class InjectionResult:
    cell: str
    concurrency: int
    inject: str
    precision: InjectionPrecision


def attributions(run: RunResults) -> list[Attribution]:
    """The likely race behind each flagged arm, as the sweep's summary derived it from the store."""
    return list(run_summary(run).attribution)


def injection_results(run: RunResults) -> list[InjectionResult]:
    """Per injected arm and concurrency: did the questions that diverged match the injected ones?"""
    out = []
    for cell in run.cells:
        inject = cell.spec.arm.inject if cell.spec else None
        for concurrency, entry in cell.verdicts.items():
            if inject and entry.injection is not None:
                out.append(InjectionResult(cell.name, concurrency, inject, entry.injection))
    return out


def _fraction(value: float | None) -> str:
    return "–" if value is None else f"{value:.2f}"


def _harness(race: RaceOutcome, *, evidence: bool) -> list[str]:
    lines = [
        f"Harness (vLLM's scheduler in-process): **{race.status}**"
        + (f" — {race.reason}" if race.reason else "")
    ]
    # `pdcheck race --json` as the harness wrote it (its own schema: pdcheck.race.run.RaceSummary).
    result = race.result or {}
    if result.get("fixes_absent"):
        lines.append(
            f"This vLLM lacks {', '.join(result['fixes_absent'])}: switching them off changes nothing."
        )
    variants = result.get("variants") or []
    if not evidence or not variants:
        return lines
    rows = [
        [
            v.get("variant", "?"),
            f"{v.get('seeds_with_findings', 0)}/{v.get('seeds', 0)}",
            ", ".join(f"{k} {s:g}" for k, s in (v.get("median_first_step_by_family") or {}).items())
            or "–",
            ", ".join(f"{k} ×{n}" for k, n in (v.get("findings_by_kind") or {}).items()) or "–",
            f"{v.get('steps_per_s', 0):,.0f}",
        ]
        for v in variants
    ]
    lines += [
        "",
        table(
            ["variant", "seeds with findings", "median first step", "findings by kind", "steps/s"],
            rows,
        ),
    ]
    for v in variants:
        example = (v.get("examples") or [None])[0]
        if example:
            lines.append(
                f"\n- `{v.get('variant')}` example: {example.get('kind')} at seed {example.get('seed')}, "
                f"step {example.get('step')}: {example.get('detail', '')}"
            )
    return lines


def race_sections(run: RunResults) -> tuple[str, str]:
    """The section in full, and compact (harness status and the named races, no tables)."""
    found = attributions(run)
    injected = injection_results(run)
    return _race_section(run, found, injected, evidence=True), _race_section(
        run, found, [], evidence=False
    )


def _race_section(
    run: RunResults, found: list[Attribution], injected: list[InjectionResult], *, evidence: bool
) -> str:
    parts = []
    if run.race is None and not run.environment_races:
        parts.append(
            "The race harness did not run in this sweep (no `race:` section); run `pdcheck race`."
        )
    elif run.race is not None:
        parts.append("\n".join(_harness(run.race, evidence=evidence)))
    # The harness in each other environment's python: its verdict, and its evidence in full mode.
    for race in run.environment_races:
        lines = _harness(race, evidence=evidence)
        lines[0] = f"On environment `{race.environment}`: " + lines[0]
        parts.append("\n".join(lines))
    if found and not evidence:
        parts.append(
            "**Likely races**: " + "; ".join(f"{a.race} ({a.cell or 'harness'})" for a in found)
        )
    elif found:
        rows = [
            [a.race, a.rule, f"`{a.cell}`" if a.cell else "harness", "; ".join(a.evidence)]
            for a in found
        ]
        parts.append(
            "**Attribution** (rules in docs/analysis.md)\n\n"
            + table(["likely race", "rule", "arm", "evidence"], rows)
        )
    else:
        parts.append(
            "**Attribution**: no arm was flagged and the harness found nothing, so no race is named."
        )
    if injected:
        rows = [
            [
                f"`{r.cell}`",
                str(r.concurrency),
                r.inject,
                str(r.precision.n_injected),
                str(r.precision.n_flagged),
                _fraction(r.precision.precision),
                _fraction(r.precision.recall),
            ]
            for r in injected
        ]
        parts.append(
            "**Fault-injection precision** (corruption-grade divergences vs the injected questions)\n\n"
            + table(["arm", "c", "fault", "injected", "diverged", "precision", "recall"], rows)
        )
    return "\n\n".join(parts)
