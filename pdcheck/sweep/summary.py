"""The run's `summary.json`: every cell's outcome per concurrency, counts and the exit code.

Built from the store alone (`RunResults`), so a merged or resumed run summarises the same way
as a run done in one go.
"""

from __future__ import annotations

import logging
from typing import Any

from pydantic import ValidationError

from pdcheck.sweep.outcomes import INFRA_ERROR, Outcome, count, exit_code
from pdcheck.sweep.store import CellResult, RunResults

logger = logging.getLogger(__name__)


def cell_outcomes(cell: CellResult) -> list[tuple[int, Outcome]]:
    """One outcome per concurrency level; a level with no verdict is an infra outcome with the cause."""
    out = []
    for c in cell.concurrency or tuple(cell.verdicts):
        entry = cell.verdicts.get(c)
        if entry is not None and entry.outcome:
            out.append((c, Outcome(**entry.outcome)))
            continue
        if cell.failure is not None:
            why = f"{cell.failure.error_type} during {cell.failure.where}: {cell.failure.message.splitlines()[0]}"
        else:
            failed = [u for u in cell.units if u.concurrency == c and u.failure is not None]
            why = (
                f"{failed[0].failure.error_type} in {failed[0].side} c{c}: {failed[0].failure.message.splitlines()[0]}"
                if failed
                else "not run (interrupted or not selected)"
            )
        out.append((c, Outcome("infra", INFRA_ERROR, cell.canary, why)))
    return out


def summarize(results: RunResults) -> dict[str, Any]:
    cells = []
    statuses = []
    verdict_names = []
    for cell in results.cells:
        outcomes = cell_outcomes(cell)
        statuses += [o.status for _, o in outcomes]
        verdict_names += [o.verdict for _, o in outcomes]
        reused = sorted({u.reused_from for u in cell.units if u.reused_from})
        cells.append(
            {
                "name": cell.name,
                "id": cell.id,
                "dirname": cell.dirname,
                "canary": cell.canary,
                "baseline_reused_from": reused,
                "failure": None
                if cell.failure is None
                else {
                    "error_type": cell.failure.error_type,
                    "message": cell.failure.message,
                    "where": cell.failure.where,
                },
                "results": [{"concurrency": c} | o.to_dict() for c, o in outcomes],
            }
        )
    race_status = None
    if results.race is not None:
        race_status = results.race.get("status")
        statuses.append(race_status or "infra")
    code = exit_code(statuses)
    return {
        "sweep": results.info.sweep.get("name"),
        "cells": cells,
        "attribution": attribution(results),
        "race": results.race,
        "counts": {"status": count(statuses), "verdict": count(verdict_names)},
        "exit_code": int(code),
    }


def attribution(results: RunResults) -> list[dict[str, Any]]:
    """Which race most likely explains the flags, from the arms' verdicts and the harness's findings."""
    from pdcheck.analysis import ArmObservation, Verdict, attribute
    from pdcheck.config import Cell

    arms = []
    for cell in results.cells:
        if not cell.verdicts:
            continue
        try:
            resolved = Cell.model_validate(cell.resolved)
        except ValidationError as exc:
            logger.warning(
                "%s: cell.json holds no valid cell (%s); left out of attribution", cell.dirname, exc
            )
            continue
        arms.append(
            ArmObservation.from_cell(
                resolved,
                verdicts={c: Verdict(v.name) for c, v in cell.verdicts.items()},
                delta_pts={
                    c: v.verdict["delta_pts"]
                    for c, v in cell.verdicts.items()
                    if v.verdict.get("delta_pts") is not None
                },
            )
        )
    families: dict[str, int] = {}
    harness = (results.race or {}).get("result") or {}
    for variant in harness.get("variants", []):
        for family, n in variant.get("seeds_by_family", {}).items():
            families[family] = families.get(family, 0) + n
    return [a.to_dict() for a in attribute(arms, race_findings_by_family=families)]
