"""A run's summary from its per-question records: accuracy, invalid and error rates, speed, latency.

Accuracy and invalid rate count answered questions only (`ok` records): a request that failed
says nothing about the model, so it is kept apart in `error_rate` (over all questions) instead
of being scored as wrong, as vLLM's and lm-eval's scripts do.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from pdcheck.evals.records import QuestionRecord

SUMMARY_SCHEMA_VERSION = 1


@dataclass(frozen=True)
class EvalSummary:
    """One eval run: the numbers and the settings that produced them."""

    n: int
    n_ok: int
    accuracy: float | None
    invalid_rate: float | None
    error_rate: float
    questions_per_s: float | None
    output_tokens_per_s: float | None
    latency_p50_s: float | None
    latency_p99_s: float | None
    wall_s: float | None
    dataset_sha256: str
    task: str
    style: str
    engine: str
    limit: int | None
    offset: int
    concurrency: int
    model: str | None = None
    # The run's stop rule ended it before every question was asked (`arun_eval(should_stop=...)`).
    stopped: bool = False
    schema_version: int = SUMMARY_SCHEMA_VERSION


def percentile(values: Sequence[float], q: float) -> float | None:
    """Linear-interpolated percentile (numpy's default method); None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q / 100.0
    lo = int(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def summarize(
    records: Sequence[QuestionRecord],
    *,
    timed: Sequence[QuestionRecord] | None = None,
    wall_s: float | None,
    dataset_sha256: str,
    task: str,
    style: str,
    engine: str,
    limit: int | None,
    offset: int,
    concurrency: int,
    model: str | None = None,
    stopped: bool = False,
) -> EvalSummary:
    """Summarize `records`; speed comes from `timed` (the records this session sent) over `wall_s`."""
    timed = records if timed is None else timed
    ok = [r for r in records if r.ok]
    n, n_ok = len(records), len(ok)
    latencies = [r.latency_s for r in timed if r.ok and r.latency_s is not None]
    out_tokens = sum(r.completion_tokens or 0 for r in timed if r.ok)
    # The wall time speeds are measured over; None when there is none to divide by.
    per_s = wall_s if wall_s is not None and wall_s > 0 and len(timed) > 0 else None
    return EvalSummary(
        n=n,
        n_ok=n_ok,
        accuracy=sum(r.correct for r in ok) / n_ok if n_ok else None,
        invalid_rate=sum(r.invalid for r in ok) / n_ok if n_ok else None,
        error_rate=(n - n_ok) / n if n else 0.0,
        questions_per_s=len(timed) / per_s if per_s is not None else None,
        output_tokens_per_s=out_tokens / per_s if per_s is not None else None,
        latency_p50_s=percentile(latencies, 50),
        latency_p99_s=percentile(latencies, 99),
        wall_s=wall_s,
        dataset_sha256=dataset_sha256,
        task=task,
        style=style,
        engine=engine,
        limit=limit,
        offset=offset,
        concurrency=concurrency,
        model=model,
        stopped=stopped,
    )
