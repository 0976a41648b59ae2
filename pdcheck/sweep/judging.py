"""Judge one cell at one concurrency level from what the store holds, and record the verdict.

Reads the baseline and PD records of that level, pairs them with `compare_paired`, turns the
comparison into a `CellVerdict` with `decide` (which also turns "no KV transferred" into
INFRA-ERROR), applies the canary logic (`judge`), and writes verdicts/c<N>.json.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from pdcheck.analysis.injection import InjectionPrecision
from pdcheck.analysis.paired import PairedComparison
from pdcheck.analysis.verdict import CellVerdict, Outcome, Verdict, judge
from pdcheck.config import Cell, level_expectation
from pdcheck.evals.records import QuestionRecord
from pdcheck.sweep.plan import SIDES, Unit
from pdcheck.sweep.schema import KvEvidence
from pdcheck.sweep.store import CellStore, load_cell


def level_ready(cell: Cell, cs: CellStore, concurrency: int) -> bool:
    """Every unit of the level is done or failed: a verdict can be given now."""
    for side in SIDES:
        for r in range(cell.eval.repeats):
            unit = cs.dir / side / f"c{concurrency}" / f"r{r}"
            if not ((unit / "summary.json").is_file() or (unit / "failure.json").is_file()):
                return False
    return True


def judge_level(cell: Cell, cs: CellStore, concurrency: int) -> Outcome:
    from pdcheck.analysis import compare_paired, decide

    result = load_cell(cs.dir)
    units = [u for u in result.units if u.concurrency == concurrency]
    failed = [u for u in units if not u.done]
    if failed:
        first = failed[0]
        why = (
            f"{first.failure.error_type} in {first.side} c{concurrency}: {first.failure.first_line}"
            if first.failure
            else f"{first.side} c{concurrency} did not finish"
        )
        return _record(cell, cs, concurrency, CellVerdict(Verdict.INFRA_ERROR, why))
    pd = {u.repeat: u.records() for u in units if u.side == "pd"}
    asked = {r.index for r in pd[0]}
    # An early-stopped PD unit answered fewer questions: pair the baseline over those only.
    baseline = {
        u.repeat: [r for r in u.records() if r.index in asked]
        for u in units
        if u.side == "baseline"
    }
    stop = next((u.early_stop for u in units if u.side == "pd" and u.early_stop), None)
    policy = cell.analysis
    comparison = compare_paired(
        baseline[0],
        pd[0],
        alpha=policy.alpha,
        tie_epsilon_nats=policy.tie_epsilon_nats,
        margin_pts=policy.margin_pts,
        baseline_repeats=tuple(baseline[r] for r in sorted(baseline) if r != 0),
        pd_repeats=tuple(pd[r] for r in sorted(pd) if r != 0),
        expected_accuracy=cell.model.expected_accuracy,
        expected_rtol=cell.model.expected_rtol,
    )
    verdict = decide(
        comparison, policy=policy, kv_transferred_tokens=kv_tokens(result.kv, concurrency)
    )
    if stop is not None and verdict.verdict is not Verdict.INFRA_ERROR:
        # The sequential test's call is valid at any stopping time; the fixed-n power rule is not.
        verdict = dataclasses.replace(
            verdict, verdict=stop.verdict, reason=f"early stop: {stop.reason}"
        )
    injection = None
    if cell.arm.inject is not None:
        injection = _injection_precision(
            comparison,
            result.kv.get((concurrency, 0)),
            pd[0],
            run_tag=Unit(cell.id, "pd", concurrency, 0).run_tag,
        )
    return _record(cell, cs, concurrency, verdict, comparison=comparison, injection=injection)


def _injection_precision(
    comparison: PairedComparison,
    evidence: KvEvidence | None,
    pd: list[QuestionRecord],
    *,
    run_tag: str,
) -> InjectionPrecision | None:
    """Which injected questions the agreement check flagged (corruption-grade divergences)."""
    from pdcheck.analysis import divergence_precision

    if evidence is None or evidence.injections is None:
        return None  # attach mode or no plugin folder: no log to compare against
    return divergence_precision(
        evidence.injections,
        comparison.agreement,
        run_tag=run_tag,
        questions=[r.index for r in pd],
    )


def carry_level(
    cell: Cell, cs: CellStore, concurrency: int, *, flagged: Outcome, at: int
) -> Outcome:
    """A level not run because level `at` was flagged (early stop): it carries that verdict."""
    reason = f"early stop: c{at} was {flagged.verdict}"
    return _record(cell, cs, concurrency, CellVerdict(flagged.verdict, reason), carried_from=at)


def judge_expected(cell: Cell, concurrency: int, verdict: Verdict, reason: str) -> Outcome:
    """The canary logic at one level: a race arm's level where the race cannot fire is a control."""
    expected = level_expectation(cell, concurrency)
    if cell.arm.canary:
        reason = f"{expected.why}; {reason}" if reason else expected.why
    return judge(verdict, reason, canary=expected.flag)


def kv_tokens(kv: Mapping[tuple[int, int], KvEvidence], concurrency: int) -> int | None:
    """KV tokens the decoders received over the level's PD units; None when no metrics were scraped."""
    total = None
    for (c, _r), evidence in kv.items():
        if c != concurrency:
            continue
        for delta in evidence.decoders:
            total = (total or 0) + int(delta.external_kv_tokens)
    return total


def _record(
    cell: Cell,
    cs: CellStore,
    concurrency: int,
    verdict: CellVerdict,
    *,
    comparison: PairedComparison | None = None,
    injection: InjectionPrecision | None = None,
    carried_from: int | None = None,
) -> Outcome:
    outcome = judge_expected(cell, concurrency, verdict.verdict, verdict.reason)
    cs.write_verdict(
        concurrency,
        verdict=verdict,
        outcome=outcome,
        comparison=comparison,
        injection=injection,
        carried_from=carried_from,
    )
    return outcome
