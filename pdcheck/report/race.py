"""The race-findings section: the harness's results, attribution across arms, injection precision.

- Harness: the sweep stores `pdcheck race --json` under `race/summary.json` (status, reason, and
  the harness's own JSON under `result`); shown per variant with an example finding each.
- Attribution: `analysis.attribute` over the stored verdicts of every arm, plus the harness's
  findings per family; the rules are in docs/analysis.md.
- Injection precision: for arms that injected faults, the plugin's `injections.jsonl` in the
  cell's folder against the questions that diverged beyond a near-tie (`analysis.injection_precision`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pdcheck.analysis.agreement import TIE
from pdcheck.analysis.attribution import ArmObservation, Attribution, attribute
from pdcheck.analysis.injection import InjectionPrecision, injection_precision
from pdcheck.analysis.paired import PairedComparison
from pdcheck.analysis.verdict import Verdict
from pdcheck.config import Cell
from pdcheck.report.sections import table
from pdcheck.sweep.plan import Unit
from pdcheck.sweep.store import CellResult, RunResults

__all__ = ["InjectionResult", "attributions", "injection_results", "race_sections"]


@dataclass(frozen=True)
class InjectionResult:
    cell: str
    concurrency: int
    inject: str
    precision: InjectionPrecision


def _comparison(cell: CellResult, concurrency: int) -> PairedComparison | None:
    entry = cell.verdicts.get(concurrency)
    return PairedComparison.from_dict(entry.comparison) if entry and entry.comparison else None


def _harness_families(race: Mapping[str, Any] | None) -> dict[str, int]:
    result = (race or {}).get("result") or {}
    families: dict[str, int] = {}
    for variant in result.get("variants", []):
        for family, seeds in variant.get("seeds_by_family", {}).items():
            families[family] = families.get(family, 0) + int(seeds)
    return families


def attributions(run: RunResults) -> list[Attribution]:
    """The likely race behind each flagged arm, from the stored verdicts and the harness findings."""
    observations = []
    for cell in run.cells:
        verdicts = {c: Verdict(e.name) for c, e in cell.verdicts.items() if e.name in Verdict.__members__.values()}
        deltas = {c: comp.delta_pts for c in cell.verdicts
                  if (comp := _comparison(cell, c)) is not None and comp.delta_pts is not None}
        observations.append(ArmObservation.from_cell(Cell.model_validate(cell.resolved), verdicts=verdicts,
                                                     delta_pts=deltas))
    return attribute(observations, race_findings_by_family=_harness_families(run.race))


def _injections(run: RunResults, cell: CellResult) -> list[dict[str, Any]]:
    entries = []
    for path in sorted((run.info.root / "cells" / cell.dirname / "plugin").glob("decode-*/injections.jsonl")):
        with open(path, encoding="utf-8") as f:
            entries += [json.loads(line) for line in f if line.strip()]
    return entries


def injection_results(run: RunResults) -> list[InjectionResult]:
    """Per injecting arm and concurrency: did the questions that diverged match the injected ones?"""
    out = []
    for cell in run.cells:
        inject = (cell.resolved.get("arm") or {}).get("inject")
        if not inject:
            continue
        log = _injections(run, cell)
        for concurrency in cell.verdicts:
            comparison = _comparison(cell, concurrency)
            pd = cell.unit("pd", concurrency, 0)
            if comparison is None or pd is None:
                continue
            flagged = [d.index for d in comparison.agreement.divergences if d.grade != TIE]
            precision = injection_precision(log, flagged, run_tag=Unit(cell.id, "pd", concurrency, 0).run_tag,
                                            questions=[r.index for r in pd.records() if r.ok])
            out.append(InjectionResult(cell.name, concurrency, inject, precision))
    return out


def _fraction(value: float | None) -> str:
    return "–" if value is None else f"{value:.2f}"


def _harness(race: Mapping[str, Any], *, evidence: bool) -> list[str]:
    status = race.get("status", "?")
    lines = [f"Harness (vLLM's scheduler in-process): **{status}**" + (f" — {race['reason']}" if race.get("reason") else "")]
    result = race.get("result") or {}
    if result.get("fixes_absent"):
        lines.append(f"This vLLM lacks {', '.join(result['fixes_absent'])}: switching them off changes nothing.")
    variants = result.get("variants") or []
    if not evidence or not variants:
        return lines
    rows = [[
        v.get("variant", "?"), f"{v.get('seeds_with_findings', 0)}/{v.get('seeds', 0)}",
        ", ".join(f"{k} {s:g}" for k, s in (v.get("median_first_step_by_family") or {}).items()) or "–",
        ", ".join(f"{k} ×{n}" for k, n in (v.get("findings_by_kind") or {}).items()) or "–",
        f"{v.get('steps_per_s', 0):,.0f}",
    ] for v in variants]
    lines += ["", table(["variant", "seeds with findings", "median first step", "findings by kind", "steps/s"], rows)]
    for v in variants:
        example = (v.get("examples") or [None])[0]
        if example:
            lines.append(f"\n- `{v.get('variant')}` example: {example.get('kind')} at seed {example.get('seed')}, "
                         f"step {example.get('step')}: {example.get('detail', '')}")
    return lines


def race_sections(run: RunResults) -> tuple[str, str]:
    """The section in full, and compact (harness status and the named races, no tables)."""
    found = attributions(run)
    injected = injection_results(run)
    return _race_section(run, found, injected, evidence=True), _race_section(run, found, [], evidence=False)


def _race_section(run: RunResults, found: list[Attribution], injected: list[InjectionResult], *,
                  evidence: bool) -> str:
    parts = []
    if run.race is None:
        parts.append("The race harness did not run in this sweep (no `race:` section); run `pdcheck race`.")
    else:
        parts.append("\n".join(_harness(run.race, evidence=evidence)))
    if found and not evidence:
        parts.append("**Likely races**: " + "; ".join(f"{a.race} ({a.cell or 'harness'})" for a in found))
    elif found:
        rows = [[a.race, a.rule, f"`{a.cell}`" if a.cell else "harness", "; ".join(a.evidence)] for a in found]
        parts.append("**Attribution** (rules in docs/analysis.md)\n\n" + table(["likely race", "rule", "arm", "evidence"], rows))
    else:
        parts.append("**Attribution**: no arm was flagged and the harness found nothing, so no race is named.")
    if injected:
        rows = [[f"`{r.cell}`", str(r.concurrency), r.inject, str(r.precision.n_injected), str(r.precision.n_flagged),
                 _fraction(r.precision.precision), _fraction(r.precision.recall)] for r in injected]
        parts.append("**Fault-injection precision** (questions that diverged beyond a near-tie vs the injected ones)\n\n"
                     + table(["arm", "c", "fault", "injected", "diverged", "precision", "recall"], rows))
    return "\n\n".join(parts)
