"""`--early-stop` inside a PD unit: stop asking once a regression is certain (mixture SPRT).

The baseline of the same level runs first, so each PD record that arrives is paired with its
baseline answer and fed to analysis's `SequentialTest`. When the test stops, the eval is
aborted (the records so far stay on disk) and the unit is summarised from what it has, with
the stop's evidence attached, so the verdict can say REGRESSION without the remaining questions.
"""

from __future__ import annotations

from typing import Any

from pdcheck.evals.records import QuestionRecord, read_records


class EarlyStopped(Exception):
    """Raised from the record callback to abort the eval; carries the analysis's EarlyStop."""

    def __init__(self, stop):
        super().__init__(stop.reason)
        self.stop = stop


class UnitStopper:
    """Pairs PD records with the baseline as they arrive; raises EarlyStopped when the test stops."""

    def __init__(self, baseline: list[QuestionRecord], *, design):
        from pdcheck.analysis import SequentialTest

        self._baseline = {r.index: r for r in baseline}
        self._test = SequentialTest(design)

    def feed(self, record: QuestionRecord) -> None:
        base = self._baseline.get(record.index)
        if base is None or not (base.ok and record.ok):
            return  # a failed request is not a pair
        self._test.add(baseline_correct=base.correct, pd_correct=record.correct)
        stop = self._test.should_stop()
        if stop is not None:
            raise EarlyStopped(stop)


def stopped_summary(
    records_path, stopped: EarlyStopped, *, task, settings, concurrency: int, model: str | None
) -> dict[str, Any]:
    """The unit's summary from the records it has, plus the stop that ended it."""
    from pdcheck.evals.summary import summarize

    records = read_records(records_path)
    summary = summarize(
        records,
        wall_s=None,
        dataset_sha256=task.sha256,
        task=task.task,
        style=settings.style,
        engine=settings.engine,
        limit=settings.limit,
        offset=settings.offset,
        concurrency=concurrency,
        model=model,
    )
    return summary.to_dict() | {"early_stop": stopped.stop.to_dict()}
