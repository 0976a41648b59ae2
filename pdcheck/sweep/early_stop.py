"""`--early-stop` inside a PD unit: stop asking once a regression is certain.

The baseline of the same level runs first, so each PD record that arrives is paired with its
baseline answer and fed to a `StopRule`. The `UnitStopper` is the eval's `should_stop`: when the
rule decides, the eval cancels the questions still out and returns a summary marked stopped,
and the rule's `EarlyStop` goes into the unit's summary file, so the verdict can say REGRESSION
without the remaining questions.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol

from pdcheck.analysis.sequential import EarlyStop
from pdcheck.config import AnalysisPolicy
from pdcheck.evals.records import QuestionRecord


class StopRule(Protocol):
    """A running test over answered (baseline, PD) pairs, fed in the order PD answered them.

    `add` takes one pair and returns the decision to stop, or None to keep asking; once it has
    returned a decision it is not asked again.
    """

    def add(self, baseline: QuestionRecord, pd: QuestionRecord) -> EarlyStop | None: ...


class SequentialRule:
    """The mixture SPRT of `pdcheck.analysis.sequential` on correctness, as a `StopRule`."""

    def __init__(self, policy: AnalysisPolicy):
        from pdcheck.analysis import SequentialTest

        self._test = SequentialTest(alpha=policy.alpha, margin_pts=policy.margin_pts)

    def add(self, baseline: QuestionRecord, pd: QuestionRecord) -> EarlyStop | None:
        self._test.add(baseline_correct=baseline.correct, pd_correct=pd.correct)
        return self._test.should_stop()


class UnitStopper:
    """Pairs PD records with the baseline as they arrive; the eval's `should_stop`.

    `stop` holds the rule's decision once it is made.
    """

    def __init__(self, baseline: Iterable[QuestionRecord], rule: StopRule):
        self._baseline = {r.index: r for r in baseline}
        self._rule = rule
        self.stop: EarlyStop | None = None

    def __call__(self, record: QuestionRecord) -> bool:
        base = self._baseline.get(record.index)
        if self.stop is not None or base is None or not (base.ok and record.ok):
            return self.stop is not None  # a failed request is not a pair
        self.stop = self._rule.add(base, record)
        return self.stop is not None
