"""Verdicts: turn a PairedComparison into PASS / REGRESSION / SUSPECT / INCONCLUSIVE / INFRA-ERROR.

Kept apart from the statistics so that alpha and the margin come from the sweep's policy. The
rules, first match wins:

1. INFRA-ERROR: servers failed (`infra_error`), the decoder received no KV
   (`kv_transferred_tokens == 0`: PD was bypassed, so the run proves nothing), a side's request
   error rate is above `max_error_rate`, or no question was answered on both sides.
2. REGRESSION: the one-sided McNemar p-value is below alpha AND the observed drop is larger
   than the effective margin. The margin keeps tiny significant differences on a huge n from
   failing; the test keeps large noisy differences on a small n from failing. The effective
   margin is the policy's margin, raised to the noise floor z_{1−α}·√2·σ when repeated
   baseline runs measured a run-to-run std σ (a drop within what two runs of the same
   configuration show cannot fail).
3. SUSPECT: PD has significantly more corruption-grade divergences than the control
   (one-sided Fisher at alpha), without an accuracy drop. Needs logprobs: without them a
   near-tie flip cannot be told from corruption, and divergences are reported, not judged.
4. INCONCLUSIVE: the margin is below the minimum detectable effect at this n.
5. PASS.
"""

from __future__ import annotations

import enum
import math
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TypeVar

import numpy as np
import numpy.typing as npt
from scipy import stats

from pdcheck.analysis.paired import PairedComparison
from pdcheck.analysis.power import summarize_power
from pdcheck.analysis.stats import mcnemar_worse_p
from pdcheck.config import AnalysisPolicy
from pdcheck.errors import ExitCode

_Key = TypeVar("_Key", bound=str)

__all__ = [
    "CanaryStatus",
    "CellVerdict",
    "Outcome",
    "Status",
    "Verdict",
    "canary_status",
    "count",
    "decide",
    "judge",
    "regression_mask",
    "run_exit_code",
]


class Verdict(enum.StrEnum):
    PASS = "PASS"
    REGRESSION = "REGRESSION"
    SUSPECT = "SUSPECT"
    INCONCLUSIVE = "INCONCLUSIVE"
    INFRA_ERROR = "INFRA-ERROR"

    @property
    def flagged(self) -> bool:
        """A verdict that says PD damaged the output."""
        return self in (Verdict.REGRESSION, Verdict.SUSPECT)

    @property
    def exit_code(self) -> ExitCode:
        """0 PASS and INCONCLUSIVE (underpowered is a warning, not a failure), 1 flagged, 2 INFRA-ERROR."""
        if self.flagged:
            return ExitCode.FAILED
        if self is Verdict.INFRA_ERROR:
            return ExitCode.INFRA
        return ExitCode.OK


@dataclass(frozen=True)
class CellVerdict:
    """One cell's verdict at one concurrency, with a one-line reason and the numbers behind it.

    The numbers are None for a level that was not judged from a comparison (its units failed,
    or an early stop carried a lower level's verdict to it).
    """

    verdict: Verdict
    reason: str
    n_pairs: int | None = None
    delta_pts: float | None = None
    ci_low_pts: float | None = None
    ci_high_pts: float | None = None
    p_value: float | None = None
    alpha: float | None = None
    margin_pts: float | None = None
    effective_margin_pts: float | None = None
    mde_pts: float | None = None
    n_needed: int | None = None
    baseline_errors: int | None = None
    pd_errors: int | None = None
    suspect_p_value: float | None = None
    kv_transferred_tokens: int | None = None


def regression_mask(
    worse: npt.ArrayLike,
    better: npt.ArrayLike,
    n: npt.ArrayLike,
    *,
    alpha: float,
    margin_pts: float,
) -> npt.NDArray[np.bool_]:
    """REGRESSION rule on counts (element-wise on arrays): significant AND drop beyond the margin.

    The simulation tests call this same function on thousands of simulated cells at once.
    """
    w, b, count = np.asarray(worse), np.asarray(better), np.asarray(n)
    drop_pts = 100.0 * (w - b) / np.maximum(count, 1)
    mask: npt.NDArray[np.bool_] = (
        (mcnemar_worse_p(w, b) < alpha) & (drop_pts > margin_pts) & (count > 0)
    )
    return mask


def noise_floor_pts(baseline_std: float | None, *, alpha: float) -> float:
    """The drop two runs of one configuration exceed with probability alpha: z_{1−α}·√2·σ, in points."""
    if baseline_std is None:
        return 0.0
    return 100.0 * float(stats.norm.ppf(1 - alpha)) * math.sqrt(2.0) * baseline_std


# Above max_error_rate failed requests on either side, the run measures the servers, not the model.
def _infra_reason(
    comparison: PairedComparison,
    infra_error: str | None,
    kv_transferred_tokens: int | None,
    max_error_rate: float,
) -> str | None:
    if infra_error:
        return f"servers failed: {infra_error}"
    if kv_transferred_tokens == 0:
        return "the decoder received no KV: PD was bypassed, so the run proves nothing"
    for side, s in (("baseline", comparison.baseline), ("pd", comparison.pd)):
        if s.error_rate > max_error_rate:
            return f"{side} had {s.n_errors}/{s.n_records} failed requests (> {100 * max_error_rate:g}%)"
    if comparison.n_pairs == 0:
        return "no question was answered on both sides"
    return None


def decide(
    comparison: PairedComparison,
    *,
    policy: AnalysisPolicy,
    infra_error: str | None = None,
    kv_transferred_tokens: int | None = None,
) -> CellVerdict:
    """The verdict for one comparison under `policy` (alpha, margin_pts); see the module docstring."""
    c = comparison
    power = summarize_power(
        n_pairs=c.n_pairs,
        discordance=c.discordance,
        alpha=policy.alpha,
        margin_pts=policy.margin_pts,
    )
    effective = max(policy.margin_pts, noise_floor_pts(c.jitter.baseline_std, alpha=policy.alpha))
    suspect_p = c.control.p_value if c.control is not None and c.control.judged else None

    def verdict(v: Verdict, reason: str) -> CellVerdict:
        return CellVerdict(
            verdict=v,
            reason=reason,
            n_pairs=c.n_pairs,
            delta_pts=c.delta_pts,
            ci_low_pts=c.ci_low_pts,
            ci_high_pts=c.ci_high_pts,
            p_value=c.p_value,
            alpha=policy.alpha,
            margin_pts=policy.margin_pts,
            effective_margin_pts=effective,
            mde_pts=power.mde_pts,
            n_needed=power.n_needed_for_margin,
            baseline_errors=c.baseline.n_errors,
            pd_errors=c.pd.n_errors,
            suspect_p_value=suspect_p,
            kv_transferred_tokens=kv_transferred_tokens,
        )

    infra = _infra_reason(c, infra_error, kv_transferred_tokens, policy.max_error_rate)
    if infra is not None:
        return verdict(Verdict.INFRA_ERROR, infra)
    delta = f"Δ {c.delta_pts:+.2f} pts [{c.ci_low_pts:+.2f}, {c.ci_high_pts:+.2f}]"
    if bool(
        regression_mask(c.worse, c.better, c.n_pairs, alpha=policy.alpha, margin_pts=effective)
    ):
        return verdict(
            Verdict.REGRESSION,
            f"PD lost accuracy: {delta}, McNemar p={c.p_value:.2g} < {policy.alpha:g}, "
            f"drop > margin {effective:.2f} pts (n={c.n_pairs})",
        )
    ct = c.control
    if ct is not None and suspect_p is not None and suspect_p < policy.alpha:
        return verdict(
            Verdict.SUSPECT,
            f"{ct.pd_count}/{ct.pd_pairs} {ct.basis} divergences vs {ct.control_count}/{ct.control_pairs} "
            f"in the {ct.source} (Fisher p={suspect_p:.2g}); {delta}",
        )
    if power.underpowered:
        return verdict(
            Verdict.INCONCLUSIVE,
            f"underpowered: detects drops ≥ {power.mde_pts:.2f} pts at n={c.n_pairs}, margin is "
            f"{policy.margin_pts:g} pts; needs n ≥ {power.n_needed_for_margin}; {delta}",
        )
    return verdict(
        Verdict.PASS,
        f"no drop beyond {effective:.2f} pts: {delta}, p={c.p_value:.2g} (n={c.n_pairs})",
    )


class CanaryStatus(enum.StrEnum):
    OK = "OK"  # the canary was flagged: the suite can still see this race
    FAILED = "FAILED"  # PASS or INCONCLUSIVE: the suite lost its power to detect this race
    UNKNOWN = "UNKNOWN"  # INFRA-ERROR: the canary never really ran


def canary_status(verdict: Verdict) -> CanaryStatus:
    """A canary arm (fixes off, injected faults) exists to be flagged; anything else is a detection failure.

    INCONCLUSIVE counts as FAILED: a canary too small to be seen proves the suite cannot see the
    race at this n.
    """
    if verdict.flagged:
        return CanaryStatus.OK
    if verdict is Verdict.INFRA_ERROR:
        return CanaryStatus.UNKNOWN
    return CanaryStatus.FAILED


class Status(enum.StrEnum):
    """What a verdict means for a cell once the canary logic has run: drives junit and the exit code."""

    PASS = "pass"
    FAIL = "fail"
    INFRA = "infra"
    INCONCLUSIVE = "inconclusive"


@dataclass(frozen=True)
class Outcome:
    """A verdict judged against what the arm expects (see `judge`)."""

    status: Status
    verdict: Verdict
    canary: bool
    reason: str


def judge(verdict: Verdict, reason: str, *, canary: bool) -> Outcome:
    """The canary logic: for a canary arm (injected faults, fixes off) a flag is the expected result.

    A canary that comes out PASS or INCONCLUSIVE is a failure: the suite lost its detection power.
    """
    if verdict is Verdict.INFRA_ERROR:
        return Outcome(Status.INFRA, verdict, canary, reason)
    if canary:
        if canary_status(verdict) is CanaryStatus.OK:
            return Outcome(Status.PASS, verdict, canary, f"canary flagged as expected: {reason}")
        return Outcome(
            Status.FAIL,
            verdict,
            canary,
            f"canary NOT flagged ({verdict}): the suite lost its detection power; {reason}",
        )
    if verdict.flagged:
        return Outcome(Status.FAIL, verdict, canary, reason)
    if verdict is Verdict.INCONCLUSIVE:
        return Outcome(Status.INCONCLUSIVE, verdict, canary, reason)
    return Outcome(Status.PASS, verdict, canary, reason)


def run_exit_code(statuses: Iterable[Status]) -> ExitCode:
    """A run's exit code: 1 beats 2, since a real failure is the more important news; 2 when only infra went wrong."""
    seen = set(statuses)
    if Status.FAIL in seen:
        return ExitCode.FAILED
    if Status.INFRA in seen:
        return ExitCode.INFRA
    return ExitCode.OK


def count(values: Iterable[_Key]) -> dict[_Key, int]:
    """How often each status or verdict occurs, keys sorted (as summary.json lists them)."""
    return dict(sorted(Counter(values).items()))
