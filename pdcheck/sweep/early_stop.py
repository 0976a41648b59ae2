"""`--early-stop` inside a PD unit: stop asking once a REGRESSION or a PASS is certain.

The baseline of the same level runs first, so each PD record that arrives is paired with its
baseline answer and fed to a `StopRule`: the level's one group-sequential test, shared by its
repeat units (repeats pool into one test). The `UnitStopper` is the eval's `should_stop`: when the
rule decides, the eval cancels the questions still out and returns a summary marked stopped,
and the rule's `EarlyStop` goes into the unit's summary file, so the verdict can say REGRESSION
without the remaining questions.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol

from pdcheck.analysis.sequential import EarlyStop, SequentialTest
from pdcheck.evals.records import QuestionRecord


class StopRule(Protocol):
    """A running test over answered (baseline, PD) pairs, fed in the order PD answered them.

    `add` takes one pair and returns the decision to stop, or None to keep asking; once it has
    returned a decision it is not asked again.
    """

    def add(self, baseline: QuestionRecord, pd: QuestionRecord) -> EarlyStop | None: ...


class SequentialRule:
    """The level's `SequentialTest` (`pdcheck.analysis.sequential`) on correctness, as a `StopRule`.

    One test per level: every repeat unit of the level feeds the same one, so a test that
    stopped in repeat 0 stops repeat 1 at its first answer.
    """

    def __init__(self, test: SequentialTest):
        self._test = test

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
