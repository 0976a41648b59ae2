"""The early-stop seam: `UnitStopper` pairs PD records with the baseline and asks any `StopRule`."""

from __future__ import annotations

from pdcheck.analysis.design import Design
from pdcheck.analysis.sequential import EarlyStop, SequentialTest
from pdcheck.analysis.verdict import Verdict
from pdcheck.evals.records import QuestionRecord
from pdcheck.sweep.early_stop import SequentialRule, UnitStopper


def _record(index: int, *, correct: bool, ok: bool = True) -> QuestionRecord:
    return QuestionRecord(index=index, prompt_sha256="p", gold="1", ok=ok, correct=correct and ok)


class StopAfter:
    """A stand-in rule: stops after `n` pairs, and remembers what it was given."""

    def __init__(self, n: int):
        self.n = n
        self.pairs: list[tuple[int, int]] = []

    def add(self, baseline: QuestionRecord, pd: QuestionRecord) -> EarlyStop | None:
        self.pairs.append((baseline.index, pd.index))
        if len(self.pairs) < self.n:
            return None
        return EarlyStop(Verdict.REGRESSION, len(self.pairs), 0, 0, "enough")


def test_any_rule_plugs_in_and_failed_requests_are_not_pairs():
    """The stopper feeds the rule answered pairs only, stops when it decides, and keeps its decision."""
    baseline = [_record(i, correct=True, ok=i != 1) for i in range(10)]
    rule = StopAfter(3)
    stop = UnitStopper(baseline, rule)
    answers = [stop(_record(i, correct=False, ok=i != 2)) for i in (0, 1, 2, 3, 4, 5)]
    assert answers == [False, False, False, False, True, True]
    assert rule.pairs == [(0, 0), (3, 3), (4, 4)], "question 1 failed on the baseline, 2 on PD"
    assert stop.stop is not None and stop.stop.reason == "enough"


def test_the_sequential_rule_stops_a_collapse_early_and_its_repeats_with_it():
    """The shipped rule (the level's group-sequential test) calls REGRESSION on an all-wrong PD at
    its first look (30 pairs); the level's next repeat, fed to the same test, stops at once."""
    baseline = [_record(i, correct=True) for i in range(100)]
    test = SequentialTest(Design.plan(200, alpha=0.05, margin_pts=5.0, early_stop=True))
    stop = UnitStopper(baseline, SequentialRule(test))
    n = next(i for i in range(100) if stop(_record(i, correct=False)))
    assert n == 29 and stop.stop is not None and stop.stop.verdict is Verdict.REGRESSION
    repeat = UnitStopper(baseline, SequentialRule(test))
    assert repeat(_record(0, correct=True)) and repeat.stop == stop.stop
