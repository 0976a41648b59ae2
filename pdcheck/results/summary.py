"""The run's `summary.json`: every cell's outcome per concurrency, counts and the exit code.

Built from the store alone (`RunResults`), so a merged or resumed run summarises the same way
as a run done in one go.
"""

from __future__ import annotations

import logging

from pydantic import ValidationError

from pdcheck.analysis.attribution import ArmObservation, Attribution, attribute
from pdcheck.analysis.verdict import Outcome, Status, Verdict, count, run_exit_code, unjudged
from pdcheck.results.schema import CellSummary, Counts, LevelResult, RunSummary, stamp
from pdcheck.results.store import CellResult, RunResults

logger = logging.getLogger(__name__)


def cell_outcomes(cell: CellResult) -> list[tuple[int, Outcome]]:
    """One outcome per concurrency level; a level with no verdict is an infra outcome with the cause."""
    out = []
    for c in cell.concurrency or tuple(cell.verdicts):
        entry = cell.verdicts.get(c)
        if entry is not None:
            out.append((c, entry.outcome))
            continue
        unit = next((u for u in cell.units if u.concurrency == c and u.failure), None)
        why = (
            f"{unit.failure.error_type} in {unit.side} c{c}: {unit.failure.first_line}"
            if unit is not None and unit.failure is not None
            else "not run (interrupted or not selected)"
        )
        out.append((c, unjudged(why, canary=cell.canary)))
    return out


def summarize(results: RunResults) -> RunSummary:
    """The run's summary, attribution included (computed here, once per finish)."""
    cells = []
    statuses: list[Status] = []
    verdicts: list[Verdict] = []
    for cell in results.cells:
        outcomes = cell_outcomes(cell)
        statuses += [o.status for _, o in outcomes]
        verdicts += [o.verdict for _, o in outcomes]
        cells.append(
            CellSummary(
                name=cell.name,
                id=cell.id,
                dirname=cell.dirname,
                canary=cell.canary,
                baseline_reused_from=tuple(
                    sorted({u.reused_from for u in cell.units if u.reused_from})
                ),
                results=tuple(
                    LevelResult(
                        concurrency=c,
                        status=o.status,
                        verdict=o.verdict,
                        canary=o.canary,
                        reason=o.reason,
                    )
                    for c, o in outcomes
                ),
            )
        )
    if results.race is not None:
        statuses.append(results.race.status)
    # A race the harness finds in another environment's vLLM is a finding of this sweep too.
    statuses += [race.status for race in results.environment_races]
    return RunSummary(
        **stamp(results.info.provenance),
        sweep=results.info.sweep.name,
        cells=tuple(cells),
        attribution=tuple(attribution(results)),
        race=results.race,
        environment_races=results.environment_races,
        counts=Counts(status=count(statuses), verdict=count(verdicts)),
        exit_code=int(run_exit_code(statuses)),
    )


def attribution(results: RunResults) -> list[Attribution]:
    """Which race most likely explains the flags, from the arms' verdicts and the harness's findings."""
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
                verdicts={c: v.verdict.verdict for c, v in cell.verdicts.items()},
                delta_pts={
                    c: v.verdict.delta_pts
                    for c, v in cell.verdicts.items()
                    if v.verdict.delta_pts is not None
                },
                carried_from={
                    c: v.carried_from
                    for c, v in cell.verdicts.items()
                    if v.carried_from is not None
                },
            )
        )
    families = results.race.findings_by_family() if results.race is not None else {}
    return attribute(arms, race_findings_by_family=families)


def run_summary(results: RunResults) -> RunSummary:
    """The finished run's stored summary, or (while it is unfinished) one built from the store."""
    return results.summary if results.summary is not None else summarize(results)
