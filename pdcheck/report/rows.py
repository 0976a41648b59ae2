"""The report's rows: one per cell and concurrency, read from the results store only.

Verdicts and statuses come from `pdcheck.results.summary.cell_outcomes`, the function that
also feeds `summary.json` and `junit.xml`, so the markdown, JSON and JUnit renderings cannot
disagree about a verdict. The numbers come from the stored comparison and unit summaries, and
the interval's level from the stored design that computed it.
"""

from __future__ import annotations

import functools
import re
import statistics
from dataclasses import asdict, dataclass
from typing import Any

from pdcheck.analysis.design import Design
from pdcheck.analysis.power import tolerated_discordance
from pdcheck.analysis.verdict import Status, Verdict
from pdcheck.analysis.verdict import interval_confidence as verdict_interval_confidence
from pdcheck.config.cells import Side
from pdcheck.results.load import CellResult, RunResults, kv_tokens
from pdcheck.results.schema import VerdictFile
from pdcheck.results.summary import cell_outcomes

__all__ = ["ResultRow", "build_rows", "interval_confidence", "short_reason"]


@dataclass(frozen=True)
class ResultRow:
    """One verdict: a cell at one concurrency, with the numbers behind it (accuracies as fractions)."""

    cell: str
    cell_id: str
    dirname: str
    model: str
    arm: str
    concurrency: int
    canary: bool  # expected to be flagged at this level
    status: Status  # after the canary logic
    verdict: Verdict
    reason: str
    n: int | None = None
    baseline_accuracy: float | None = None
    pd_accuracy: float | None = None
    delta_pts: float | None = None
    ci_low_pts: float | None = None
    ci_high_pts: float | None = None
    # The two-sided confidence of [ci_low_pts, ci_high_pts]; None when the folder did not record it.
    ci_level: float | None = None
    p_value: float | None = None  # raw
    adjusted_p: float | None = None  # Holm over the run's clean tests (a canary: its own p)
    delta_invalid_pts: float | None = None
    agreement: float | None = None
    kv_tokens: int | None = None
    mde_pts: float | None = None
    baseline_reused_from: str | None = None
    # A canary arm's level where its race cannot fire (async off or concurrency 1): must PASS.
    control: bool = False
    # The pairs the test planned (its design's last look); n is fewer after an early stop.
    planned_n: int | None = None
    # The level whose flag an early stop carried to this one (this level did not run).
    carried_from: int | None = None
    # A few words for the terminal; `reason` is the whole sentence.
    short_reason: str = ""
    # The share of questions PD and the baseline disagree on (every repeat pooled), and the
    # largest share at which this level's design still meets the power rule.
    discordance: float | None = None
    tolerated_discordance: float | None = None

    @property
    def key(self) -> tuple[str, int]:
        return (self.cell, self.concurrency)

    @property
    def failing(self) -> bool:
        return self.status in (Status.FAIL, Status.INFRA)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _mean(values: list[float]) -> float | None:
    return statistics.fmean(values) if values else None


def _side_accuracy(cell: CellResult, side: Side, concurrency: int) -> float | None:
    return _mean(
        [
            u.summary.accuracy
            for u in cell.units
            if u.side == side
            and u.concurrency == concurrency
            and u.summary is not None
            and u.summary.accuracy is not None
        ]
    )


def interval_confidence(entry: VerdictFile) -> float | None:
    """The proven two-sided confidence of the verdict's interval, from the design that computed it.

    `verdict.decide` draws each end at the design's equivalence alpha a (alpha with one look,
    alpha/k with early stop's k margin looks); what is proven for the pair is
    `verdict.interval_confidence`: at least 1 − (2 + D_SHARE)·a, printed as "≥89%" at a = 0.05.
    A verdict stored without its design (pdcheck before issue 17) does not say, and neither
    does the report.
    """
    design = entry.verdict.design
    return None if design is None else verdict_interval_confidence(design.equivalence_alpha)


# A reason opens with its headline; after the first clause break come the numbers behind it.
_CLAUSE_BREAK = re.compile(r":|;| \(|, p=")
_EARLY_STOP = re.compile(r"^early stop, [^;]*; ")


def short_reason(
    *,
    verdict: Verdict,
    status: Status,
    canary: bool,
    reason: str,
    carried_from: int | None = None,
) -> str:
    """A few words for the terminal: the reason's headline, said as a canary or the gate sees it.

    `reason` is the verdict's own sentence (the analysis's, before the canary logic wraps it); an
    early stop's note at its start is left out (the row's n and planned_n say it stopped early).
    """
    stopped = _EARLY_STOP.match(reason)
    body = reason[stopped.end() :] if stopped else reason
    headline = _CLAUSE_BREAK.split(body, maxsplit=1)[0].strip() or str(verdict)
    if carried_from is not None:
        # Early stop carries only a flag, and the level's own reason just names where it was seen.
        headline = f"flagged at c{carried_from}"
    if canary and status is Status.PASS:
        return "canary flagged" if carried_from is None else f"canary {headline}"
    if canary and status is Status.FAIL:
        return f"canary NOT flagged, {headline}"
    if status is Status.FAIL and not verdict.flagged and verdict is not Verdict.INFRA_ERROR:
        # INCONCLUSIVE, or NO-DROP-SHOWN under analysis.allow_no_drop_shown: false.
        return f"{headline}, fails the gate"
    return headline


def _numbers(entry: VerdictFile) -> dict[str, Any]:
    """The table's analysis numbers, from the stored PairedComparison and CellVerdict."""
    v = entry.verdict
    numbers: dict[str, Any] = {
        "mde_pts": v.mde_pts,
        "kv_tokens": v.kv_transferred_tokens,
        "adjusted_p": v.adjusted_p_value,
    }
    c = entry.comparison
    if c is None:
        return numbers
    if v.design is not None and v.power_drop_pts is not None and c.n_pairs:
        numbers["discordance"] = (c.worse + c.better) / c.n_pairs
        numbers["tolerated_discordance"] = _tolerated(
            v.design, extra_pts=v.power_drop_pts - v.design.margin_pts
        )
    # Δ, its interval and p are the verdict's (every repeat pooled, the interval at the level
    # the test used); a verdict stored before issue 17 has only the comparison's.
    pooled = v.n_pairs is not None and v.p_value is not None
    return numbers | {
        "n": v.n_pairs if pooled else c.n_pairs,
        "baseline_accuracy": c.baseline.accuracy,
        "pd_accuracy": c.pd.accuracy,
        "delta_pts": v.delta_pts if pooled else c.delta_pts,
        "ci_low_pts": v.ci_low_pts if pooled else c.ci_low_pts,
        "ci_high_pts": v.ci_high_pts if pooled else c.ci_high_pts,
        "ci_level": interval_confidence(entry) if pooled else None,
        "planned_n": v.design.planned_pairs if v.design is not None else None,
        "p_value": v.p_value if pooled else c.p_value,
        "delta_invalid_pts": c.delta_invalid_pts,
        "agreement": c.agreement.exact_match_fraction,
    }


@functools.lru_cache(maxsize=256)
def _tolerated(design: Design, *, extra_pts: float) -> float:
    """`tolerated_discordance`, once per design: a run's levels mostly share a few."""
    return tolerated_discordance(design, extra_pts=extra_pts)


def build_rows(run: RunResults) -> list[ResultRow]:
    """Every (cell, concurrency) of the run, in store order; a missing verdict is an INFRA-ERROR row."""
    rows = []
    for cell in run.cells:
        reused = sorted(
            {u.reused_from for u in cell.units if u.side == "baseline" and u.reused_from}
        )
        for concurrency, outcome in cell_outcomes(cell):
            entry = cell.verdicts.get(concurrency)
            # Accuracy from the unit summaries when no comparison was stored (an infra failure).
            numbers: dict[str, Any] = {
                "baseline_accuracy": _side_accuracy(cell, "baseline", concurrency),
                "pd_accuracy": _side_accuracy(cell, "pd", concurrency),
                "kv_tokens": kv_tokens(cell.kv, concurrency),
            }
            if entry is not None:
                numbers |= {k: v for k, v in _numbers(entry).items() if v is not None}
            carried_from = entry.carried_from if entry is not None else None
            rows.append(
                ResultRow(
                    cell=cell.name,
                    cell_id=cell.id,
                    dirname=cell.dirname,
                    model=cell.spec.model.name if cell.spec else "?",
                    arm=cell.spec.arm.name if cell.spec else "?",
                    concurrency=concurrency,
                    canary=outcome.canary,
                    control=cell.canary and not outcome.canary,
                    status=outcome.status,
                    verdict=outcome.verdict,
                    reason=outcome.reason,
                    carried_from=carried_from,
                    short_reason=short_reason(
                        verdict=outcome.verdict,
                        status=outcome.status,
                        canary=outcome.canary,
                        reason=entry.verdict.reason if entry is not None else outcome.reason,
                        carried_from=carried_from,
                    ),
                    baseline_reused_from=reused[0] if reused else None,
                    **numbers,
                )
            )
    return rows
