"""Race attribution: from a sweep's arms, name the race that most likely explains the flags.

Each arm is one cell (model, topology, async on/off, fixes disabled, injected fault) with its
verdict and Δ per concurrency. Arms are compared with their *counterparts*: the arm in the same
model and topology that differs in exactly one switch. Every rule is a pure predicate on
(arm, counterparts) plus an evidence builder, so a verdict can be traced to the observations
that produced it. The rules, in order (also the table in docs/analysis.md):

| rule | race | the arm | and its counterpart |
| --- | --- | --- | --- |
| injected | injected:<kind> | injects a fault and is flagged | (none needed) |
| block-reuse-fix | block-reuse | block-reuse fix off, flagged | same arm with the fix on passes |
| zeroing-fix | zeroing | zeroing skip off, flagged, hybrid model | same arm with the skip on passes |
| both-fixes | block-reuse or zeroing | both fixes off, flagged | fixes on passes, no single-fix arm to split |
| scheduling | scheduling race | async on, flagged, worse with concurrency (or one level) | same arm with async off passes |
| sync-failure | pd-transfer | async off, flagged, no fault injected | (none: one batch in flight rules out both races) |
| harness | block-reuse / zeroing / connector | the race harness reports findings of family BLOCK_REUSE / ZEROING / OTHER | |

"Flagged" is REGRESSION or SUSPECT at any concurrency; "passes" is PASS (or NO-DROP-SHOWN: judged,
not flagged) at every concurrency.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from pdcheck.analysis.verdict import Verdict
from pdcheck.config import Cell

__all__ = ["HARNESS_FAMILIES", "RULES", "ArmObservation", "Attribution", "attribute"]


@dataclass(frozen=True)
class ArmObservation:
    """One arm of a sweep (a cell) as attribution sees it."""

    cell: str
    model: str
    kind: str  # "full-attention" | "hybrid"
    async_scheduling: bool
    topology: str = ""
    disabled_fixes: tuple[str, ...] = ()
    inject: str | None = None
    verdicts: dict[int, Verdict] = field(default_factory=dict)  # concurrency -> verdict
    delta_pts: dict[int, float] = field(default_factory=dict)  # concurrency -> Δaccuracy
    # concurrency -> the level whose verdict an early stop carried to it (it did not run, so it
    # has no Δ of its own).
    carried_from: dict[int, int] = field(default_factory=dict)

    @classmethod
    def from_cell(
        cls,
        c: Cell,
        *,
        verdicts: Mapping[int, Verdict],
        delta_pts: Mapping[int, float],
        carried_from: Mapping[int, int] | None = None,
    ) -> ArmObservation:
        """Build from a resolved sweep cell and its per-concurrency verdicts, Δ and carried levels."""
        return cls(
            cell=c.name,
            model=c.model.name,
            kind=c.model.kind,
            async_scheduling=c.async_scheduling,
            topology=f"p{c.prefill_instances}x{c.prefill_tp}-d{c.decode_instances}x{c.decode_tp}",
            disabled_fixes=tuple(sorted(c.arm.disable_fixes)),
            inject=c.arm.inject,
            verdicts=dict(verdicts),
            delta_pts=dict(delta_pts),
            carried_from=dict(carried_from or {}),
        )

    @property
    def flagged(self) -> bool:
        return any(v.flagged for v in self.verdicts.values())

    @property
    def passes(self) -> bool:
        # A counterpart "passes" when it was judged and nothing was flagged: NO-DROP-SHOWN (not
        # flagged, powered, but unbounded) serves as well as PASS to contrast a flagged arm.
        return bool(self.verdicts) and all(
            v is Verdict.PASS or v is Verdict.NO_DROP_SHOWN for v in self.verdicts.values()
        )

    def trend_pts_per_doubling(self) -> float | None:
        """Least-squares slope of Δ against log2(concurrency); None with fewer than two levels."""
        if len(self.delta_pts) < 2:
            return None
        xs = np.log2(np.array(sorted(self.delta_pts), dtype=float))
        ys = np.array([self.delta_pts[c] for c in sorted(self.delta_pts)])
        return float(np.polyfit(xs, ys, 1)[0])

    def _level_text(self, c: int, v: Verdict) -> str:
        """A level's verdict and what it measured; a level that has no Δ says why, never NaN."""
        if c in self.carried_from:
            return f"c{c}: {v.value} (carried from c{self.carried_from[c]})"
        if c not in self.delta_pts:
            return f"c{c}: {v.value} (no Δ)"
        return f"c{c}: {v.value} ({self.delta_pts[c]:+.1f} pts)"

    def describe(self) -> str:
        per = ", ".join(self._level_text(c, v) for c, v in sorted(self.verdicts.items()))
        return f"{self.cell} [{per}]"


@dataclass(frozen=True)
class Attribution:
    """A named likely race, the rule that named it, and the observations behind it."""

    race: str
    rule: str
    cell: str
    evidence: tuple[str, ...]


Peers = Sequence["ArmObservation"]


def _counterpart(arm: ArmObservation, peers: Peers, **changes: object) -> ArmObservation | None:
    want: dict[str, object] = {
        "async_scheduling": arm.async_scheduling,
        "disabled_fixes": tuple(sorted(arm.disabled_fixes)),
        "inject": arm.inject,
        **changes,
    }
    for p in peers:
        if p is not arm and all(getattr(p, k) == v for k, v in want.items()):
            return p
    return None


def _described(arm: ArmObservation | None) -> str:
    """A counterpart in an evidence line (a rule only holds when it exists)."""
    return arm.describe() if arm is not None else "(no counterpart)"


def _without(arm: ArmObservation, fix: str) -> tuple[str, ...]:
    return tuple(sorted(f for f in arm.disabled_fixes if f != fix))


def _trend_line(arm: ArmObservation) -> str:
    slope = arm.trend_pts_per_doubling()
    if slope is None:
        return "concurrency trend unknown (one concurrency level)"
    word = "worse" if slope < 0 else "not worse"
    return f"{word} with concurrency: Δ changes {slope:+.2f} pts per doubling"


@dataclass(frozen=True)
class Rule:
    """A pure predicate on (arm, peers) and the evidence it cites when it holds."""

    name: str
    race: Callable[[ArmObservation], str]
    holds: Callable[[ArmObservation, Sequence[ArmObservation]], bool]
    evidence: Callable[[ArmObservation, Sequence[ArmObservation]], tuple[str, ...]]


def _fix_rule(fix: str, *, hybrid_only: bool) -> Rule:
    def holds(arm: ArmObservation, peers: Peers) -> bool:
        if not (arm.inject is None and fix in arm.disabled_fixes and arm.flagged):
            return False
        if hybrid_only and arm.kind != "hybrid":
            return False
        other = _counterpart(arm, peers, disabled_fixes=_without(arm, fix))
        return other is not None and other.passes

    def evidence(arm: ArmObservation, peers: Peers) -> tuple[str, ...]:
        other = _counterpart(arm, peers, disabled_fixes=_without(arm, fix))
        lines: tuple[str, ...] = (
            f"flagged with the {fix} fix off: {arm.describe()}",
            f"recovers with it on: {_described(other)}",
        )
        if fix == "zeroing":
            lines += (
                f"{arm.model} is hybrid: the zeroing race hits attention layers only, the GDN/Mamba state survives",
            )
        return lines

    return Rule(name=f"{fix}-fix", race=lambda arm: fix, holds=holds, evidence=evidence)


def _both_fixes_holds(arm: ArmObservation, peers: Peers) -> bool:
    if (
        arm.inject is not None
        or set(arm.disabled_fixes) != {"block-reuse", "zeroing"}
        or not arm.flagged
    ):
        return False
    fixed = _counterpart(arm, peers, disabled_fixes=())
    single = [_counterpart(arm, peers, disabled_fixes=(f,)) for f in ("block-reuse", "zeroing")]
    return fixed is not None and fixed.passes and all(s is None for s in single)


def _scheduling_holds(arm: ArmObservation, peers: Peers) -> bool:
    if arm.inject is not None or not arm.async_scheduling or not arm.flagged:
        return False
    sync = _counterpart(arm, peers, async_scheduling=False)
    slope = arm.trend_pts_per_doubling()
    return sync is not None and sync.passes and (slope is None or slope < 0)


RULES: tuple[Rule, ...] = (
    Rule(
        name="injected",
        race=lambda arm: f"injected:{(arm.inject or '').partition(':')[0]}",
        holds=lambda arm, peers: arm.inject is not None and arm.flagged,
        evidence=lambda arm, peers: (
            f"fault {arm.inject} injected on the decoder and flagged: {arm.describe()}",
        ),
    ),
    _fix_rule("block-reuse", hybrid_only=False),
    _fix_rule("zeroing", hybrid_only=True),
    Rule(
        name="both-fixes",
        race=lambda arm: "block-reuse or zeroing",
        holds=_both_fixes_holds,
        evidence=lambda arm, peers: (
            f"flagged with both fixes off: {arm.describe()}",
            f"recovers with both on: {_described(_counterpart(arm, peers, disabled_fixes=()))}",
            "no single-fix arm (block-reuse-off, zeroing-off) to tell the two apart",
        ),
    ),
    Rule(
        name="scheduling",
        race=lambda arm: "scheduling race",
        holds=_scheduling_holds,
        evidence=lambda arm, peers: (
            f"fails with async scheduling on: {arm.describe()}",
            f"passes with async off: {_described(_counterpart(arm, peers, async_scheduling=False))}",
            _trend_line(arm),
        ),
    ),
    Rule(
        name="sync-failure",
        race=lambda arm: "pd-transfer",
        holds=lambda arm, peers: arm.inject is None and not arm.async_scheduling and arm.flagged,
        evidence=lambda arm, peers: (
            f"flagged with async scheduling off: {arm.describe()}",
            "with one batch in flight neither race can happen: suspect the KV transfer or the connector",
        ),
    ),
)

# The race harness's finding families (`pdcheck.race.findings.Family` values, as its summary
# writes them) and the race each names. OTHER is a connector bug, e.g. loading N tokens into a hybrid.
HARNESS_FAMILIES = {"BLOCK_REUSE": "block-reuse", "ZEROING": "zeroing", "OTHER": "connector"}


def _harness_attributions(findings_by_family: Mapping[str, int]) -> list[Attribution]:
    out = []
    for family, count in sorted(findings_by_family.items()):
        if family not in HARNESS_FAMILIES:
            raise ValueError(
                f"unknown race-harness finding family {family!r}; known: {', '.join(HARNESS_FAMILIES)}"
            )
        if count > 0:
            evidence = (
                f"the in-process race harness found {count} × {family} with vLLM's real scheduler",
            )
            out.append(
                Attribution(
                    race=HARNESS_FAMILIES[family],
                    rule="harness",
                    cell="race-harness",
                    evidence=evidence,
                )
            )
    return out


def attribute(
    observations: Iterable[ArmObservation],
    *,
    race_findings_by_family: Mapping[str, int] | None = None,
) -> list[Attribution]:
    """Every rule that holds for every arm, in rule order, plus the race harness's findings.

    `race_findings_by_family` is the harness summary's count per family (e.g. its
    `seeds_by_family`, summed over variants): BLOCK_REUSE, ZEROING or OTHER.
    """
    arms = list(observations)
    groups: dict[tuple[str, str], list[ArmObservation]] = {}
    for arm in arms:
        groups.setdefault((arm.model, arm.topology), []).append(arm)
    out: list[Attribution] = []
    for arm in arms:
        peers = groups[(arm.model, arm.topology)]
        out.extend(
            Attribution(
                race=rule.race(arm),
                rule=rule.name,
                cell=arm.cell,
                evidence=rule.evidence(arm, peers),
            )
            for rule in RULES
            if rule.holds(arm, peers)
        )
    return out + _harness_attributions(race_findings_by_family or {})
