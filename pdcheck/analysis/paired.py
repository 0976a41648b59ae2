"""Compare one PD run with its same-run baseline, question by question.

Records are paired by question index, never by position: both sides must hold the same set
of indices (a ConfigError, which is a ValueError, otherwise). A record with `ok=False` is a
request error, not a wrong answer: errors are counted per side and the question leaves the
accuracy pairs. The numbers (see `stats.py` for the methods and why):

- Δaccuracy = PD − baseline over the pairs of every repeat (PD repeat k against baseline
  repeat k), with the bounds of `stats.drop_bounds` at alpha each side (an interval proven at
  ≥ 1 − 2.2·alpha, `verdict.interval_confidence`) and the one-sided exact McNemar p-value for
  "PD is worse";
- Δinvalid rate (PD − baseline, positive is worse), with the same interval;
- greedy agreement (`agreement.py`, repeat 0) and, when a control run exists, a one-sided
  Fisher test of PD's corruption-grade divergences (every repeat) against the control's (the
  baseline against its own repeats, or against a control run such as PD with async
  scheduling off). The near-tie threshold is the control's jitter alone: measured against PD,
  corruption would raise its own threshold (issue 29);
- jitter: with repeated runs per side, each side's accuracy mean and std over runs (vLLM's
  5-run table), for information: the paired test already carries run-to-run noise;
- request errors per side over every repeat;
- power (`power.py`) and vLLM's compatibility check |acc − expected| < rtol, for information.
"""

from __future__ import annotations

import itertools
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from pdcheck.analysis.agreement import Agreement, margin_jitter_nats, measure_agreement
from pdcheck.analysis.power import Power, summarize_power
from pdcheck.analysis.stats import drop_bounds, fisher_greater_p, mcnemar_worse_p, tango_interval
from pdcheck.errors import ConfigError
from pdcheck.evals.records import QuestionRecord

__all__ = [
    "Compatibility",
    "ControlTest",
    "Jitter",
    "PairedComparison",
    "SideStats",
    "compare_paired",
]

Records = Sequence[QuestionRecord]


@dataclass(frozen=True)
class SideStats:
    """One side's own numbers; accuracy and invalid rate are over its successful records."""

    n_records: int
    n_ok: int
    n_errors: int
    accuracy: float | None
    invalid_rate: float | None

    @property
    def error_rate(self) -> float:
        return self.n_errors / self.n_records if self.n_records else 0.0


@dataclass(frozen=True)
class Jitter:
    """Accuracy over repeated runs of one configuration: vLLM's 5-run table, per side."""

    baseline_runs: tuple[float, ...]
    pd_runs: tuple[float, ...]

    @staticmethod
    def _std(runs: tuple[float, ...]) -> float | None:
        return statistics.stdev(runs) if len(runs) >= 2 else None

    @property
    def baseline_mean(self) -> float | None:
        return statistics.fmean(self.baseline_runs) if self.baseline_runs else None

    @property
    def baseline_std(self) -> float | None:
        return self._std(self.baseline_runs)

    @property
    def pd_mean(self) -> float | None:
        return statistics.fmean(self.pd_runs) if self.pd_runs else None

    @property
    def pd_std(self) -> float | None:
        return self._std(self.pd_runs)


@dataclass(frozen=True)
class ControlTest:
    """PD's suspect divergences against a control's, one-sided Fisher exact test."""

    source: str  # "control" (given) or "baseline-repeat"
    basis: str  # "corruption-grade" or "any-divergence" (no logprobs recorded)
    # pd_count/pd_pairs pool every PD repeat; control_count/control_pairs every control pair.
    pd_count: int
    pd_pairs: int
    control_count: int
    control_pairs: int
    p_value: float
    # The tie threshold both counts used: the policy's floor, raised to the jitter measured
    # between the control and the baseline where they agree (before issue 30 PD's own jitter
    # raised it too). `pd_jitter_nats` is reported, never used. None before issue 17.
    tie_epsilon_nats: float | None = None
    pd_jitter_nats: float | None = None
    control_jitter_nats: float | None = None

    @property
    def judged(self) -> bool:
        """Only corruption-grade counts can make a SUSPECT verdict.

        Without logprobs a near-tie flip (numeric jitter, e.g. a different batch shape on the
        prefiller) cannot be told from corruption, so "any-divergence" is reported, not judged.
        """
        return self.basis == "corruption-grade"


@dataclass(frozen=True)
class Compatibility:
    """vLLM's own gate, |PD accuracy − expected| < rtol: information only, never the verdict."""

    expected_accuracy: float
    rtol: float
    pd_accuracy: float
    passed: bool


@dataclass(frozen=True)
class PairedComparison:
    """Everything the paired analysis found for one PD run against its baseline."""

    alpha: float
    n_pairs: int
    worse: int  # baseline right, PD wrong
    better: int  # baseline wrong, PD right
    baseline: SideStats
    pd: SideStats
    delta_pts: float | None
    ci_low_pts: float | None
    ci_high_pts: float | None
    p_value: float
    invalid_worse: int  # baseline valid, PD invalid
    invalid_better: int
    delta_invalid_pts: float | None
    invalid_ci_low_pts: float | None
    invalid_ci_high_pts: float | None
    agreement: Agreement
    control: ControlTest | None
    jitter: Jitter
    power: Power
    compatibility: Compatibility | None
    # PD's request failed where the baseline answered right: each is a PD-worse pair if the
    # failed request would have been wrong (the worst case that request errors can hide).
    # 0 in a comparison stored before issue 17.
    pd_errors_baseline_right: int = 0

    @property
    def discordance(self) -> float:
        return (self.worse + self.better) / self.n_pairs if self.n_pairs else 0.0


def _by_index(records: Records, side: str) -> dict[int, QuestionRecord]:
    out: dict[int, QuestionRecord] = {}
    for r in records:
        if r.index in out:
            raise ConfigError(
                f"{side} records hold question index {r.index} twice; one record per question is allowed"
            )
        out[r.index] = r
    return out


def _paired(
    baseline: Records, other: Records, other_side: str, *, common: bool = False
) -> list[tuple[QuestionRecord, QuestionRecord]]:
    """(baseline, other) record pairs by question index, both answered; with `common`, over the
    indices both hold, else the index sets must be equal."""
    base = _by_index(baseline, "baseline")
    oth = _by_index(other, other_side)
    if base.keys() != oth.keys() and not common:
        only_b = sorted(base.keys() - oth.keys())
        only_o = sorted(oth.keys() - base.keys())
        raise ConfigError(
            f"baseline and {other_side} answer different questions: {len(only_b)} only in baseline "
            f"(e.g. {only_b[:5]}), {len(only_o)} only in {other_side} (e.g. {only_o[:5]}); "
            "compare runs over the same question indices (same limit and offset)"
        )
    keys = sorted(base.keys() & oth.keys())
    return [(base[i], oth[i]) for i in keys if base[i].ok and oth[i].ok]


def _pd_errors_baseline_right(baseline: Records, pd: Records) -> int:
    right = {r.index for r in baseline if r.ok and r.correct}
    return sum(1 for r in pd if not r.ok and r.index in right)


def _side_stats(runs: Sequence[Records]) -> SideStats:
    """One side's numbers over every run of it: a failed request in any repeat counts."""
    records = [r for run in runs for r in run]
    ok = [r for r in records if r.ok]
    return SideStats(
        n_records=len(records),
        n_ok=len(ok),
        n_errors=len(records) - len(ok),
        accuracy=sum(r.correct for r in ok) / len(ok) if ok else None,
        invalid_rate=sum(r.invalid for r in ok) / len(ok) if ok else None,
    )


def _accuracy(records: Records) -> float | None:
    return _side_stats([records]).accuracy


def _control_pairs(
    baselines: Sequence[Records], control: Records | None
) -> tuple[str, list[tuple[QuestionRecord, QuestionRecord]]] | None:
    """The pairs whose divergences are what no corruption looks like: the baseline against a
    control run, or each baseline repeat against the next (over the questions both hold)."""
    if control is not None:
        return "control", _paired(baselines[0], control, "control")
    if len(baselines) >= 2:
        pairs = [
            p
            for a, b in itertools.pairwise(baselines)
            for p in _paired(a, b, "baseline-repeat", common=True)
        ]
        return "baseline-repeat", pairs
    return None


def _logprobs_recorded(pairs: Sequence[tuple[QuestionRecord, QuestionRecord]]) -> bool:
    return any(b.logprobs is not None for b, _ in pairs)


def _control_test(
    pd_pairs: Sequence[tuple[QuestionRecord, QuestionRecord]],
    control: tuple[str, list[tuple[QuestionRecord, QuestionRecord]]],
    *,
    tie_epsilon_nats: float,
    pd_jitter: float | None,
    control_jitter: float | None,
) -> ControlTest:
    source, pairs = control
    pd_agreement = measure_agreement(pd_pairs, tie_epsilon_nats=tie_epsilon_nats)
    ctrl = measure_agreement(pairs, tie_epsilon_nats=tie_epsilon_nats)
    # Both sides are judged on the same basis, so a run without logprobs is compared fairly.
    with_margins = _logprobs_recorded(pd_pairs) or _logprobs_recorded(pairs)
    pd_count = pd_agreement.n_corruption if with_margins else len(pd_agreement.divergences)
    ctrl_count = ctrl.n_corruption if with_margins else len(ctrl.divergences)
    return ControlTest(
        source=source,
        basis="corruption-grade" if with_margins else "any-divergence",
        pd_count=pd_count,
        pd_pairs=pd_agreement.n_pairs,
        control_count=ctrl_count,
        control_pairs=ctrl.n_pairs,
        p_value=fisher_greater_p(pd_count, pd_agreement.n_pairs, ctrl_count, ctrl.n_pairs),
        tie_epsilon_nats=tie_epsilon_nats,
        pd_jitter_nats=pd_jitter,
        control_jitter_nats=control_jitter,
    )


def _drop_interval(
    worse: int, better: int, n: int, alpha: float
) -> tuple[float | None, float | None, float | None]:
    """Δ in points with its interval: each end a one-sided bound at alpha (≥ 1 − 2.2·alpha together)."""
    if n == 0:
        return None, None, None
    drop_low, drop_up = drop_bounds(worse, better, n, alpha=alpha)
    return 100 * (better - worse) / n, -100 * float(drop_up), -100 * float(drop_low)


def compare_paired(
    baseline_records: Records,
    pd_records: Records,
    *,
    alpha: float = 0.05,
    tie_epsilon_nats: float = 0.05,
    margin_pts: float = 2.0,
    baseline_repeats: Sequence[Records] = (),
    pd_repeats: Sequence[Records] = (),
    control: Records | None = None,
    expected_accuracy: float | None = None,
    expected_rtol: float = 0.05,
) -> PairedComparison:
    """Pair `pd_records` with `baseline_records` by question index and compute every statistic.

    `baseline_repeats`/`pd_repeats` are further runs of the same configurations: PD repeat k
    pairs with baseline repeat k (a repeat pairs with a baseline run of its own, so the pooled
    pairs are independent), and the baseline repeats are the agreement control when `control`
    is not given. `margin_pts` only sets which n the power summary asks for; the verdict reads
    its margin from the policy.
    """
    if not 0 < alpha < 0.5:
        raise ConfigError(f"alpha must be in (0, 0.5), got {alpha}")
    baselines = [baseline_records, *baseline_repeats]
    pds = [pd_records, *pd_repeats]
    if len(pds) > len(baselines):
        raise ConfigError(
            f"{len(pds)} PD runs but {len(baselines)} baseline runs: each PD repeat pairs with a "
            "baseline repeat of its own (give one --baseline-repeat per --pd-repeat)"
        )
    runs = [_paired(b, p, "pd") for b, p in zip(baselines, pds, strict=False)]
    pairs = [pair for run in runs for pair in run]
    n = len(pairs)
    worse = sum(b.correct and not p.correct for b, p in pairs)
    better = sum(p.correct and not b.correct for b, p in pairs)
    inv_worse = sum(p.invalid and not b.invalid for b, p in pairs)
    inv_better = sum(b.invalid and not p.invalid for b, p in pairs)
    delta, lo, hi = _drop_interval(worse, better, n, alpha)
    # Invalid is bad, so its Δ counts PD-invalid pairs as the "increase" side (information only).
    d_inv, inv_lo, inv_hi = (
        (None, None, None)
        if n == 0
        else (
            100 * (inv_worse - inv_better) / n,
            *(100 * x for x in tango_interval(inv_better, inv_worse, n, confidence=1 - 2 * alpha)),
        )
    )
    # SUSPECT counts flips the baseline's own jitter cannot explain. The threshold is set by
    # the control alone: PD's divergences are what is being tested, so they must not move it.
    control_pairs = _control_pairs(baselines, control)
    control_jitter = margin_jitter_nats(control_pairs[1]) if control_pairs else None
    threshold = max(tie_epsilon_nats, control_jitter or 0.0)
    agreement = measure_agreement(runs[0], tie_epsilon_nats=threshold)
    pd_stats = _side_stats(pds)
    compat = None
    if expected_accuracy is not None and pd_stats.accuracy is not None:
        compat = Compatibility(
            expected_accuracy=expected_accuracy,
            rtol=expected_rtol,
            pd_accuracy=pd_stats.accuracy,
            passed=abs(pd_stats.accuracy - expected_accuracy) < expected_rtol,
        )
    return PairedComparison(
        alpha=alpha,
        n_pairs=n,
        worse=worse,
        better=better,
        baseline=_side_stats(baselines),
        pd=pd_stats,
        delta_pts=delta,
        ci_low_pts=lo,
        ci_high_pts=hi,
        p_value=float(mcnemar_worse_p(worse, better)),
        pd_errors_baseline_right=sum(
            _pd_errors_baseline_right(b, p) for b, p in zip(baselines, pds, strict=False)
        ),
        invalid_worse=inv_worse,
        invalid_better=inv_better,
        delta_invalid_pts=d_inv,
        invalid_ci_low_pts=inv_lo,
        invalid_ci_high_pts=inv_hi,
        agreement=agreement,
        control=None
        if control_pairs is None
        else _control_test(
            pairs,
            control_pairs,
            tie_epsilon_nats=threshold,
            pd_jitter=margin_jitter_nats(pairs),
            control_jitter=control_jitter,
        ),
        jitter=Jitter(
            baseline_runs=tuple(a for r in baselines if (a := _accuracy(r)) is not None),
            pd_runs=tuple(a for r in pds if (a := _accuracy(r)) is not None),
        ),
        power=summarize_power(
            n_pairs=n,
            discordance=(worse + better) / n if n else 0.0,
            alpha=alpha,
            margin_pts=margin_pts,
        ),
        compatibility=compat,
    )
