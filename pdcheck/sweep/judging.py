"""Judge one cell at one concurrency level from what the store holds, and record the verdict.

Reads the baseline and PD records of that level, pairs them with `compare_paired`, turns the
comparison into a `CellVerdict` with `decide` (which also turns "no KV transferred" into
INFRA-ERROR), applies the canary logic, and writes verdicts/c<N>.json.
"""

from __future__ import annotations

from typing import Any

from pdcheck.config import Cell, level_expectation
from pdcheck.sweep.outcomes import INFRA_ERROR, Outcome, judge
from pdcheck.sweep.plan import Unit
from pdcheck.sweep.store import CellStore, load_cell


def level_ready(cell: Cell, cs: CellStore, concurrency: int) -> bool:
    """Every unit of the level is done or failed: a verdict can be given now."""
    for side in ("baseline", "pd"):
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
            f"{first.failure.error_type} in {first.side} c{concurrency}: {first.failure.message.splitlines()[0]}"
            if first.failure
            else f"{first.side} c{concurrency} did not finish"
        )
        return _record(
            cell, cs, concurrency, comparison=None, verdict={"verdict": INFRA_ERROR, "reason": why}
        )
    pd = {u.repeat: u.records() for u in units if u.side == "pd"}
    asked = {r.index for r in pd[0]}
    # An early-stopped PD unit answered fewer questions: pair the baseline over those only.
    baseline = {
        u.repeat: [r for r in u.records() if r.index in asked]
        for u in units
        if u.side == "baseline"
    }
    stop = next(
        (
            u.summary.get("early_stop")
            for u in units
            if u.side == "pd" and u.summary.get("early_stop")
        ),
        None,
    )
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
    ).to_dict()
    if stop is not None and verdict["verdict"] != INFRA_ERROR:
        # The sequential test's call is valid at any stopping time; the fixed-n power rule is not.
        verdict |= {"verdict": stop["verdict"], "reason": f"early stop: {stop['reason']}"}
    injection = None
    if cell.arm.inject is not None:
        injection = _injection_precision(
            comparison,
            result.kv.get((concurrency, 0), {}),
            run_tag=Unit(cell.id, "pd", concurrency, 0).run_tag,
        )
    return _record(
        cell, cs, concurrency, comparison=comparison.to_dict(), verdict=verdict, injection=injection
    )


def _injection_precision(
    comparison, evidence: dict[str, Any], *, run_tag: str
) -> dict[str, Any] | None:
    """Which injected questions the agreement check flagged (corruption-grade divergences)."""
    from pdcheck.analysis import injection_precision

    if "injections" not in evidence:
        return None  # attach mode or no plugin folder: no log to compare against
    divergences = comparison.agreement.divergences
    graded = any(d.margin_nats is not None for d in divergences)
    flagged = [d.index for d in divergences if not graded or d.grade == "corruption"]
    return injection_precision(evidence["injections"], flagged, run_tag=run_tag).to_dict()


def skip_level(cell: Cell, cs: CellStore, concurrency: int, *, reason: str) -> Outcome:
    """A level not run because an earlier one was flagged (early stop): it carries that verdict."""
    verdict = reason.rsplit(" was ", 1)[-1]
    return _record(
        cell, cs, concurrency, comparison=None, verdict={"verdict": verdict, "reason": reason}
    )


def judge_expected(cell: Cell, concurrency: int, verdict: str, reason: str) -> Outcome:
    """The canary logic at one level: a race arm's level where the race cannot fire is a control."""
    expected = level_expectation(cell, concurrency)
    if cell.arm.canary:
        reason = f"{expected.why}; {reason}" if reason else expected.why
    return judge(verdict, reason, canary=expected.flag)


def kv_tokens(kv: dict[tuple[int, int], dict[str, Any]], concurrency: int) -> int | None:
    """KV tokens the decoders received over the level's PD units; None when no metrics were scraped."""
    total = None
    for (c, _r), data in kv.items():
        if c != concurrency:
            continue
        for delta in data.get("decoders", []):
            tokens = delta.get("external_kv_tokens")
            if tokens is not None:
                total = (total or 0) + int(tokens)
    return total


def _record(
    cell: Cell,
    cs: CellStore,
    concurrency: int,
    *,
    comparison: dict | None,
    verdict: dict,
    injection: dict | None = None,
) -> Outcome:
    outcome = judge_expected(cell, concurrency, verdict["verdict"], verdict.get("reason", ""))
    cs.write_verdict(
        concurrency,
        comparison=comparison,
        verdict=verdict,
        outcome=outcome.to_dict(),
        injection=injection,
    )
    return outcome
