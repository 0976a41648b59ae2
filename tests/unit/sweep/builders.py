"""Builders for store tests: a unit's eval summary as the runner would write it."""

from __future__ import annotations

from collections.abc import Sequence

from pdcheck.evals.records import QuestionRecord
from pdcheck.evals.summary import EvalSummary, summarize


def unit_summary(records: Sequence[QuestionRecord], *, concurrency: int = 1) -> EvalSummary:
    """The summary of `records`, as evals writes it for one unit (no timing)."""
    return summarize(
        records,
        wall_s=None,
        dataset_sha256="d" * 64,
        task="gsm8k",
        style="plain",
        engine="pdcheck",
        limit=None,
        offset=0,
        concurrency=concurrency,
    )
