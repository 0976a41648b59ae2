"""Verdicts: the one place that decides a level's verdict, from one `LevelEvidence`.

Kept apart from the statistics so that alpha and the margin come from the sweep's policy. The
test behind a verdict is `design.Design` (looks, shares of alpha, the margin on a confidence
bound); its run-level call is `family.decide_family` (Holm across the clean tests), which
arrives here as the evidence's `TestDecision`. `sweep/judging.py` only loads the evidence and
records what `decide` returns, and `pdcheck compare` calls the same `decide`, so the two cannot
disagree on the same evidence.

Every route, first match wins (α: the run's alpha; F: the family's size):

0. Carried (an early stop did not run this level): the verdict of the level it was carried
   from, with no numbers ("carried from c1").
1. INFRA-ERROR: the level's units or servers failed (`infra_error`); the decoder received no KV
   (`kv_transferred_tokens == 0`: PD was bypassed, so the run proves nothing); a side's request
   error rate is above `max_error_rate`; or no question was answered on both sides.
2. REGRESSION, accuracy: Holm rejects "no drop" (adjusted p ≤ α) and the last look did not show
   the drop within the margin (the policy's margin, never widened).
3. REGRESSION, KV digests: prefiller and decoder digests of a transferred block differ (not on
   an injecting arm, whose corruption is intended). No jitter explains different bytes.
4. REGRESSION, transfer evidence: decoders loaded KV tokens with no NIXL read completed.
5. REGRESSION, bit-exact: a clean level judged exactly (`exact.check_exact`) has a greedy
   divergence from its baseline; exact kernels leave no jitter to explain it (not on a canary
   level or an injecting arm).
6. SUSPECT, divergences: Holm rejects "no more corruption-grade divergences than the control"
   (one-sided Fisher, same family as the accuracy tests). Needs logprobs and a control; the
   near-tie threshold is the control's measured jitter, never PD's (`paired.py`).
7. SUSPECT, transfer evidence: prefillers released blocks no decoder read, or saw reads of
   released blocks.
8. INCONCLUSIVE, request errors: scoring PD's failed requests as wrong (where the baseline was
   right) would make it a REGRESSION.
9. INCONCLUSIVE, the baseline answers fewer questions right than margin + `power_extra_pts`.
10. PASS: the drop is shown within the margin. Guarantee: at a true drop of the margin or more,
    a level PASSes with probability at most α (the exact one-sided bound of `design.py`, over
    every look that may show it), whatever n and the discordance.
11. INCONCLUSIVE, underpowered: P(flag | drop = margin + `power_extra_pts`) < 80%, computed
    exactly for this design at α/F with the observed discordance plugged in for the true one
    (`power.power_rule`).
12. NO-DROP-SHOWN: no drop was shown at the family's level, and the test had ≥ 80% power at the
    observed discordance to flag a drop of margin + `power_extra_pts`; the drop is *not* shown
    within the margin. Guarantee: none beyond the power rule's plug-in; at a drop equal to the
    margin this route is common (issue 42), so it is never a PASS. It passes the gate unless the
    sweep sets `analysis.allow_no_drop_shown: false`.

A bit-exact level that is not a REGRESSION says so in its reason; a non-flagged verdict says
when the SUSPECT test did not run. Each verdict records its route's `Basis`; an early stop ends a
cell's higher levels only on a flag of route 2 (`CellVerdict.stops_higher_levels`).
"""

from __future__ import annotations

import enum
import math
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TypeVar

from pdcheck.analysis.design import Design, LookOutcome
from pdcheck.analysis.exact import ExactCheck, exact_regression_reason
from pdcheck.analysis.family import FamilyMember, FamilyVerdict, decide_family
from pdcheck.analysis.kv_digest import KvDigestSummary, digest_regression_reason
from pdcheck.analysis.paired import PairedComparison
from pdcheck.analysis.power import PowerRule, power_rule, summarize_power
from pdcheck.analysis.stats import D_SHARE, drop_bounds
from pdcheck.analysis.transfer_evidence import TransferEvidence
from pdcheck.config import AnalysisPolicy
from pdcheck.errors import ExitCode

_Key = TypeVar("_Key", bound=str)

__all__ = [
    "Basis",
    "CanaryStatus",
    "Carried",
    "CellVerdict",
    "LevelEvidence",
    "Outcome",
    "Status",
    "TestDecision",
    "Verdict",
    "canary_status",
    "count",
    "decide",
    "gate_exit_code",
    "interval_confidence",
    "judge",
    "look_verdict",
    "run_exit_code",
    "single_test",
    "suspect_hypothesis",
    "suspect_p",
    "unjudged",
]


class Verdict(enum.StrEnum):
    PASS = "PASS"
    REGRESSION = "REGRESSION"
    SUSPECT = "SUSPECT"
    INCONCLUSIVE = "INCONCLUSIVE"
    INFRA_ERROR = "INFRA-ERROR"
    # Powered and not flagged, but the drop is not shown within the margin (route 12).
    NO_DROP_SHOWN = "NO-DROP-SHOWN"

    @property
    def flagged(self) -> bool:
        """A verdict that says PD damaged the output."""
        return self in (Verdict.REGRESSION, Verdict.SUSPECT)

    @property
    def exit_code(self) -> ExitCode:
        """0 PASS, NO-DROP-SHOWN and INCONCLUSIVE (the gate decides those: `gate_exit_code`),
        1 flagged, 2 INFRA-ERROR."""
        if self.flagged:
            return ExitCode.FAILED
        if self is Verdict.INFRA_ERROR:
            return ExitCode.INFRA
        return ExitCode.OK


class Basis(enum.StrEnum):
    """What a verdict rests on (its route in the module docstring)."""

    ACCURACY = "accuracy"  # the paired test: routes 2 and 8-12
    KV_DIGESTS = "kv-digests"  # route 3
    TRANSFER = "transfer-evidence"  # routes 4 and 7
    BIT_EXACT = "bit-exact"  # route 5
    DIVERGENCE = "divergence"  # route 6
    INFRA = "infra"  # route 1
    CARRIED = "carried"  # route 0


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
    suspect_p_value: float | None = None  # raw one-sided Fisher p
    kv_transferred_tokens: int | None = None
    adjusted_p_value: float | None = None  # Holm-adjusted over the run's clean tests
    family_size: int | None = None
    power: float | None = None  # exact P(flag | drop = power_drop_pts) of this test's design
    power_drop_pts: float | None = None
    # The test's own numbers, kept so the run can apply Holm over all its tests at the end.
    sequential_p_value: float | None = None
    within_margin: bool | None = None
    worst_case_p_value: float | None = None
    worst_case_within_margin: bool | None = None
    design: Design | None = None  # the test's looks and levels
    # Holm-adjusted over the run's hypotheses; None when SUSPECT was not judged.
    suspect_adjusted_p_value: float | None = None
    basis: Basis = Basis.ACCURACY

    @property
    def stops_higher_levels(self) -> bool:
        """Whether an early stop may end the cell here: only on a flag from the paired test.

        Early stop saves the levels after a drop is already measured. A flag from the bytes or
        the bookkeeping (digests, transfer evidence, exactness, divergences) says the KV went
        wrong but not what it cost, and the race behind it bites hardest at higher concurrency
        (released blocks are reused only when other requests are in flight), so those levels run.
        """
        return self.verdict.flagged and self.basis is Basis.ACCURACY


@dataclass(frozen=True)
class TestDecision:
    """The statistical decision behind one verdict: the design, the test's numbers and the run's call."""

    design: Design
    member: FamilyMember
    family: FamilyVerdict
    early_stop: str | None = None  # the interim look's reason, when the test stopped early
    # The test's pairs (every repeat pooled) at its last look; the interval and Δ use them.
    worse: int = 0
    better: int = 0
    n_pairs: int = 0

    @property
    def within_margin(self) -> bool:
        return self.member.within_margin


def suspect_hypothesis(comparison: PairedComparison) -> bool:
    """SUSPECT is a hypothesis of the test's family when a control exists (judged or not: the
    family is planned before the records say whether logprobs came back)."""
    return comparison.control is not None


def suspect_p(comparison: PairedComparison) -> float | None:
    """The SUSPECT test's p-value, or None when it is not judged (no control, no logprobs)."""
    ct = comparison.control
    return ct.p_value if ct is not None and ct.judged else None


def single_test(comparison: PairedComparison, policy: AnalysisPolicy) -> TestDecision:
    """A lone test (`pdcheck compare`): one look at the end over every repeat's pairs; its
    family is its accuracy hypothesis and, with a control, its SUSPECT hypothesis."""
    c = comparison
    design = Design.plan(
        max(c.n_pairs, 1),
        alpha=policy.alpha,
        margin_pts=policy.margin_pts,
        family_size=1 + suspect_hypothesis(c),
    )
    last = len(design.looks) - 1
    outcome = design.outcome(last, c.worse, c.better, c.n_pairs)
    seq_p = design.sequential_p((outcome,))
    hidden = c.pd_errors_baseline_right
    worst = design.outcome(last, c.worse + hidden, c.better, c.n_pairs + hidden)
    member = FamilyMember(
        key="compare",
        p_value=c.p_value,
        sequential_p=seq_p,
        within_margin=outcome.within_margin,
        worst_case_p=design.sequential_p((worst,)) if hidden else None,
        worst_case_within_margin=worst.within_margin,
        suspect_p=suspect_p(c),
    )
    (family,) = decide_family([member], alpha=policy.alpha, family_size=design.family_size)
    return TestDecision(
        design=design,
        member=member,
        family=family,
        worse=c.worse,
        better=c.better,
        n_pairs=c.n_pairs,
    )


@dataclass(frozen=True)
class Carried:
    """An early stop carried level `from_level`'s flag to a level it did not run."""

    from_level: int
    verdict: Verdict


@dataclass(frozen=True)
class LevelEvidence:
    """Everything a level's verdict is decided from: the one input of `decide`.

    `comparison` holds the paired counts and greedy agreement; `decision` the test's looks and
    the run's (Holm) call on it (None: judged alone, `single_test`). The KV evidence is one entry
    per PD repeat. `comparison` is None only for a level with nothing to compare: its units failed
    (`infra_error` says how) or it was carried from another level.
    """

    comparison: PairedComparison | None = None
    decision: TestDecision | None = None
    infra_error: str | None = None
    kv_transferred_tokens: int | None = None
    digests: tuple[KvDigestSummary | None, ...] = ()
    transfers: tuple[TransferEvidence, ...] = ()
    exact: ExactCheck | None = None
    expected_flag: bool = False  # a canary level: exactness is not judged on it
    injecting: bool = False  # an injecting arm: its corruption is intended
    carried: Carried | None = None


def _infra_reason(
    comparison: PairedComparison,
    infra_error: str | None,
    kv_transferred_tokens: int | None,
    max_error_rate: float,
) -> str | None:
    """Above max_error_rate failed requests on either side, the run measures the servers, not the model."""
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


def suspect_off(comparison: PairedComparison) -> str | None:
    """Why the SUSPECT test did not run, said plainly in every non-flagged verdict."""
    if comparison.control is None:
        return "SUSPECT off: no control run (eval.repeats ≥ 2, or --control)"
    if not comparison.control.judged:
        return "SUSPECT off: no logprobs were recorded (eval.logprobs: true)"
    return None


def interval_confidence(equivalence_alpha: float) -> float:
    """The proven two-sided confidence of the printed interval [Δ low, Δ high].

    Its Δ-low end is the margin's bound, ≥ 1 − a (a: the design's equivalence alpha); its Δ-high
    end is the test's side, ≥ 1 − (1 + D_SHARE)·a (`stats.drop_bounds`). Together ≥ 1 − (2 +
    D_SHARE)·a: 89% at a = 0.05, printed as "≥89%", never the 1 − 2a the ends would have alone.
    """
    return 1.0 - (2.0 + D_SHARE) * equivalence_alpha


def unjudged(reason: str, *, canary: bool) -> Outcome:
    """A level with no verdict file (not run, or its units failed before judging): INFRA-ERROR."""
    return Outcome(Status.INFRA, Verdict.INFRA_ERROR, canary, reason)


def look_verdict(outcome: LookOutcome, *, equivalence: bool) -> Verdict | None:
    """What an interim look decides: REGRESSION when it rejects, PASS when it may show the margin
    and does (route 10's guarantee covers these looks), None to go on."""
    if outcome.rejected:
        return Verdict.REGRESSION
    if outcome.within_margin and equivalence:
        return Verdict.PASS
    return None


def _kv_routes(e: LevelEvidence) -> tuple[Verdict, str, Basis] | None:
    """Routes 3-5: REGRESSION from the bytes, the transfer bookkeeping, or bit-exactness."""
    if not e.injecting:
        for summary in e.digests:
            reason = digest_regression_reason(summary)
            if reason is not None:
                return Verdict.REGRESSION, f"KV digests: {reason}", Basis.KV_DIGESTS
    for found in e.transfers:
        reason = found.regression_reason()
        if reason is not None:
            return Verdict.REGRESSION, f"transfer evidence: {reason}", Basis.TRANSFER
    if _exact_judged(e):
        reason = exact_regression_reason(e.exact)
        if reason is not None:
            return Verdict.REGRESSION, reason, Basis.BIT_EXACT
    return None


def _exact_judged(e: LevelEvidence) -> bool:
    return e.exact is not None and e.exact.exact and not e.expected_flag and not e.injecting


def _transfer_suspect(e: LevelEvidence) -> str | None:
    for found in e.transfers:
        reason = found.suspect_reason()
        if reason is not None:
            return f"transfer evidence: {reason}"
    return None


def decide(
    evidence: LevelEvidence | PairedComparison,
    *,
    policy: AnalysisPolicy,
    decision: TestDecision | None = None,
    infra_error: str | None = None,
    kv_transferred_tokens: int | None = None,
) -> CellVerdict:
    """The verdict for one level under `policy`; the module docstring lists every route in order.

    A bare `PairedComparison` is the evidence of a lone comparison with no KV evidence
    (`decision`, `infra_error` and `kv_transferred_tokens` then fill the rest of it).
    """
    if isinstance(evidence, PairedComparison):
        evidence = LevelEvidence(
            comparison=evidence,
            decision=decision,
            infra_error=infra_error,
            kv_transferred_tokens=kv_transferred_tokens,
        )
    elif decision is not None or infra_error is not None or kv_transferred_tokens is not None:
        raise TypeError("pass decision, infra_error and kv_transferred_tokens in the LevelEvidence")
    e = evidence
    if e.carried is not None:
        return CellVerdict(
            e.carried.verdict,
            f"carried from c{e.carried.from_level} (early stop: c{e.carried.from_level} was "
            f"{e.carried.verdict}; this level did not run)",
            basis=Basis.CARRIED,
        )
    if e.comparison is None:
        return CellVerdict(
            Verdict.INFRA_ERROR, e.infra_error or "no comparison was made", basis=Basis.INFRA
        )
    return _decide_compared(e, e.comparison, policy)


def _decide_compared(e: LevelEvidence, c: PairedComparison, policy: AnalysisPolicy) -> CellVerdict:
    d = e.decision if e.decision is not None else single_test(c, policy)
    design = d.design
    effective = design.margin_pts  # the policy's margin: nothing widens it
    alpha_test = design.alpha_test
    # The test's pairs: every repeat pooled (the comparison's tables show repeat 0).
    n, worse, better = d.n_pairs, d.worse, d.better
    discordance = (worse + better) / n if n else 0.0
    delta_pts = 100.0 * (better - worse) / n if n else None
    p_raw = d.member.p_value
    # Informational (Connor's normal approximation): the exact rule is `rule` below.
    approx = summarize_power(
        n_pairs=n,
        discordance=discordance,
        alpha=alpha_test,
        margin_pts=effective + policy.power_extra_pts,
    )
    rule: PowerRule | None = None
    # The exact bounds of the margin decision (`stats.drop_bounds`), as Δ = −drop.
    drop_low, drop_up = drop_bounds(worse, better, max(n, 1), alpha=design.equivalence_alpha)
    lo, hi = (-float(drop_up), -float(drop_low)) if n else (math.nan, math.nan)
    # Δ's upper end at the level the test's last look used (its share of alpha / F): ≥ 0 exactly
    # when that look does not reject, so the reason never shows a drop the verdict did not.
    last_alpha = design.looks[-1].alpha_share * alpha_test
    test_low, _ = drop_bounds(worse, better, max(n, 1), alpha=last_alpha)
    hi_test = -float(test_low) if n else math.nan
    p_suspect = suspect_p(c)
    off = suspect_off(c)
    exact_note = None
    if _exact_judged(e) and e.exact is not None:
        exact_note = f"bit-exact: {e.exact.n_identical}/{e.exact.n_pairs} greedy outputs identical"

    def verdict(
        v: Verdict, reason: str, basis: Basis = Basis.ACCURACY, *, statistical: bool = True
    ) -> CellVerdict:
        if statistical and off is not None and not v.flagged and v is not Verdict.INFRA_ERROR:
            reason = f"{reason}; {off}"
        if exact_note is not None and v is not Verdict.REGRESSION and v is not Verdict.INFRA_ERROR:
            reason = f"{reason}; {exact_note}"
        return CellVerdict(
            verdict=v,
            reason=reason,
            n_pairs=n,
            delta_pts=delta_pts,
            ci_low_pts=100 * lo if n else None,
            ci_high_pts=100 * hi if n else None,
            p_value=p_raw,
            alpha=policy.alpha,
            margin_pts=policy.margin_pts,
            effective_margin_pts=effective,
            mde_pts=approx.mde_pts,
            n_needed=approx.n_needed_for_margin,
            baseline_errors=c.baseline.n_errors,
            pd_errors=c.pd.n_errors,
            suspect_p_value=p_suspect,
            kv_transferred_tokens=e.kv_transferred_tokens,
            adjusted_p_value=d.family.adjusted_p,
            family_size=d.family.family_size,
            power=None if rule is None else rule.power,
            power_drop_pts=effective + policy.power_extra_pts,
            sequential_p_value=d.member.sequential_p,
            within_margin=d.member.within_margin,
            worst_case_p_value=d.member.worst_case_p,
            worst_case_within_margin=d.member.worst_case_within_margin,
            design=design,
            suspect_adjusted_p_value=d.family.suspect_adjusted_p,
            basis=basis,
        )

    # Route 1.
    infra = _infra_reason(c, e.infra_error, e.kv_transferred_tokens, policy.max_error_rate)
    if infra is not None:
        return verdict(Verdict.INFRA_ERROR, infra, Basis.INFRA)
    level = interval_confidence(design.equivalence_alpha)
    delta = (
        f"Δ {delta_pts:+.2f} pts, ≥{100 * level:g}% CI [{100 * lo:+.2f}, {100 * hi:+.2f}]; "
        f"at the test's level ({last_alpha:.2g}) Δ ≤ {100 * hi_test:+.2f}"
    )
    p_text = (
        f"p={p_raw:.2g} raw, {d.family.adjusted_p:.2g} adjusted "
        f"(Holm over {d.family.family_size} hypothes{'es' if d.family.family_size > 1 else 'is'})"
    )
    stopped = f"early stop, {d.early_stop}; " if d.early_stop else ""
    # Route 2.
    if d.family.flagged:
        return verdict(
            Verdict.REGRESSION,
            f"{stopped}PD lost accuracy: {delta}, {p_text} ≤ {policy.alpha:g}; a drop beyond "
            f"the {effective:.2f}-pt margin is not excluded (n={n})",
        )
    # Routes 3-5.
    kv = _kv_routes(e)
    if kv is not None:
        return verdict(*kv, statistical=False)
    # Route 6.
    ct = c.control
    if ct is not None and p_suspect is not None and d.family.suspect_flagged:
        return verdict(
            Verdict.SUSPECT,
            f"{ct.pd_count}/{ct.pd_pairs} {ct.basis} divergences vs {ct.control_count}/{ct.control_pairs} "
            f"in the {ct.source} (Fisher p={p_suspect:.2g} raw, {d.family.suspect_adjusted_p:.2g} "
            f"adjusted ≤ {policy.alpha:g}, tie threshold {c.agreement.tie_epsilon_nats:.3g} nats "
            f"from the {ct.source}'s jitter); {delta}",
            Basis.DIVERGENCE,
        )
    # Route 7.
    suspect = _transfer_suspect(e)
    if suspect is not None:
        return verdict(Verdict.SUSPECT, suspect, Basis.TRANSFER, statistical=False)
    # Route 8.
    if d.family.error_sensitive:
        return verdict(
            Verdict.INCONCLUSIVE,
            f"request errors could hide a drop: scoring PD's {c.pd_errors_baseline_right} failed "
            f"requests (where the baseline was right) as wrong gives a REGRESSION; {delta}, {p_text}",
        )
    # Route 9.
    baseline_acc = c.baseline.accuracy
    drop_pts = effective + policy.power_extra_pts
    if baseline_acc is not None and baseline_acc < drop_pts / 100:
        return verdict(
            Verdict.INCONCLUSIVE,
            f"the baseline answers {100 * baseline_acc:.1f}% right, so PD cannot lose "
            f"{drop_pts:g} pts: the run cannot show a drop; {delta}",
        )
    # Route 10.
    if d.within_margin:
        return verdict(
            Verdict.PASS,
            f"{stopped}within the margin: the drop is at most {-100 * lo:.2f} pts ≤ {effective:.2f} "
            f"(one-sided ≥{100 * (1 - design.equivalence_alpha):g}% bound); {delta}, {p_text}",
        )
    # Failed requests (or a run cut short) left fewer pairs than planned: the power is that of
    # the pairs the test had, not of the plan (an early stop chose to stop: its plan stands).
    powered_design = design
    if d.early_stop is None and 0 < n < design.planned_pairs:
        powered_design = Design.plan(
            n,
            alpha=design.alpha,
            margin_pts=design.margin_pts,
            family_size=design.family_size,
            early_stop=len(design.looks) > 1,
        )
    rule = power_rule(
        powered_design,
        discordance=discordance,
        extra_pts=policy.power_extra_pts,
        baseline_accuracy=baseline_acc,
    )
    # Route 11.
    if rule.underpowered:
        return verdict(
            Verdict.INCONCLUSIVE,
            f"underpowered: P(flag | drop {rule.drop_pts:g} pts) = {rule.power:.2f} < "
            f"{rule.target:g} at n={n}, observed discordance {100 * discordance:.1f}% plugged in; "
            f"needs about n ≥ {approx.n_needed_for_margin}; {delta}",
        )
    # Route 12.
    return verdict(
        Verdict.NO_DROP_SHOWN,
        f"no drop shown, and not shown within the {effective:.2f}-pt margin either (the drop "
        f"may be up to {-100 * lo:.2f} pts): {delta}, {p_text}; a {rule.drop_pts:g}-pt drop "
        f"would be flagged with probability {rule.power:.2f} at the observed discordance",
    )


def gate_exit_code(
    verdict: Verdict, *, allow_inconclusive: bool, allow_no_drop_shown: bool = True
) -> ExitCode:
    """The gate's exit code: INCONCLUSIVE fails (1) unless the policy allows it, and so does
    NO-DROP-SHOWN when the policy forbids it.

    "We could not tell" must not look like "no regression": a CI job too small to see the
    margin says so by failing, unless its sweep opts in with `analysis.allow_inconclusive`.
    """
    if verdict is Verdict.INCONCLUSIVE and not allow_inconclusive:
        return ExitCode.FAILED
    if verdict is Verdict.NO_DROP_SHOWN and not allow_no_drop_shown:
        return ExitCode.FAILED
    return verdict.exit_code


class CanaryStatus(enum.StrEnum):
    OK = "OK"  # the canary was flagged: the suite can still see this race
    FAILED = "FAILED"  # not flagged: the suite lost its power to detect this race
    UNKNOWN = "UNKNOWN"  # INFRA-ERROR: the canary never really ran


def canary_status(verdict: Verdict) -> CanaryStatus:
    """A canary arm (fixes off, injected faults) exists to be flagged; anything else is a detection failure.

    INCONCLUSIVE and NO-DROP-SHOWN count as FAILED: a canary too small to be seen proves the suite cannot see the
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


def judge(
    verdict: Verdict,
    reason: str,
    *,
    canary: bool,
    allow_inconclusive: bool = False,
    allow_no_drop_shown: bool = True,
) -> Outcome:
    """The canary logic: for a canary arm (injected faults, fixes off) a flag is the expected result.

    A canary that comes out PASS, NO-DROP-SHOWN or INCONCLUSIVE is a failure: the suite lost its
    detection power. A clean INCONCLUSIVE fails the gate too unless the policy allows it
    (`gate_exit_code`). A clean NO-DROP-SHOWN is status "inconclusive" (not a PASS: the drop is
    not bounded) and fails the gate only where the policy forbids it.
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
        if gate_exit_code(verdict, allow_inconclusive=allow_inconclusive) is ExitCode.OK:
            return Outcome(Status.INCONCLUSIVE, verdict, canary, reason)
        return Outcome(
            Status.FAIL,
            verdict,
            canary,
            f"we could not tell, which fails the gate (analysis.allow_inconclusive is false): {reason}",
        )
    if verdict is Verdict.NO_DROP_SHOWN:
        if allow_no_drop_shown:
            return Outcome(Status.INCONCLUSIVE, verdict, canary, reason)
        return Outcome(
            Status.FAIL,
            verdict,
            canary,
            f"the drop is not shown within the margin, which fails the gate "
            f"(analysis.allow_no_drop_shown is false): {reason}",
        )
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
