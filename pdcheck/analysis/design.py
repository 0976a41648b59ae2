"""The decision procedure of one paired test: its looks, its share of alpha, and its margin rule.

One test is one PD configuration at one concurrency level against its baseline, with every
repeat's pairs pooled in one stream (repeat 0's pairs in finish order, then repeat 1's, ...).
Among the discordant pairs, W are PD-worse and B PD-better; the drop is (W − B)/n.

**Looks.** Without early stop there is one look, at the end. With early stop there are a few
looks fixed in advance: after 30 and 60 pairs (so a collapse stops within 60 questions),
at a quarter, half and three quarters of the planned pairs, and at the end. Each look k owns
a share s_k of the test's alpha (`EARLY_SHARE`, `QUARTER_SHARE`, the rest at the end; the
shares sum to 1).

**Rejection.** At look k the exact one-sided McNemar p-value p_k = P(Bin(W+B, ½) ≥ W) is
compared with s_k·alpha_test. By Bonferroni over the looks,
P(some look rejects | no drop) ≤ Σ s_k·alpha_test = alpha_test, whatever the looks'
correlation, and the conditional binomial is exact at any count, so no normal approximation
is needed at 30 pairs. The test's sequential p-value is p_seq = min_k p_k / s_k over the looks
it reached; it is a valid p-value (P(p_seq ≤ u) ≤ u), so the run can apply Holm to it
(`family.py`). The early stop and the final test are the same test: one alpha, spent once.

**Margin.** The margin is judged on a confidence bound, never on the running estimate: a look
whose one-sided upper bound on the drop (`stats.drop_bounds`, exact, at `equivalence_alpha`)
is at most the margin has *shown* the drop is within the margin. Such a look cannot reject,
and with early stop an interim look that shows it stops the test: PASS is then certain
("within the margin"). The bound is checked at the quarter looks and the end, each at
alpha / (number of those looks), so by Bonferroni over those looks the chance that a drop of
the margin or more is ever called "within" is at most alpha, for every n and discordance
(checked exactly for the shipped designs in `tests/unit/analysis/test_margin_bound.py`). Both
rules only remove rejections, so neither costs false-alarm control; what they cost in power
is in the exact power (`power.py`), which is computed for this same design.

`alpha_test` is alpha / family_size: the level a hypothesis gets at Holm's first step, the
family being every hypothesis of the run's clean tests (`family.py`: each test's accuracy
hypothesis, and its SUSPECT hypothesis where SUSPECT is judged). Stopping early for a
regression at that level is consistent with Holm at the end (a p_seq ≤ alpha/F is always
rejected by Holm).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from pdcheck.analysis.stats import Bools, drop_within_margin, mcnemar_worse_p

__all__ = ["EARLY_LOOK_PAIRS", "Design", "Look", "LookOutcome"]

# A 40-point collapse shows within 60 pairs; the shares are small so the final look keeps
# most of its power (0.75 of alpha_test at the end). Tuned by exact computation: see
# docs/notes/issue-17.md for the trade-off between early looks and final power.
EARLY_LOOK_PAIRS = (30, 60)
EARLY_SHARE = 0.08
QUARTER_FRACTIONS = (0.25, 0.5, 0.75)
QUARTER_SHARE = 0.03


@dataclass(frozen=True)
class Look:
    """One planned look: after `pairs` pairs, with its share of the test's alpha."""

    pairs: int
    alpha_share: float
    # The margin bound may stop the test for PASS here (interim quarter looks; the end decides anyway).
    equivalence: bool


@dataclass(frozen=True)
class LookOutcome:
    """What one look found: its p-value, whether it rejected, whether the drop is within the margin."""

    look: int  # index into Design.looks
    n_pairs: int
    worse: int
    better: int
    p_value: float
    threshold: float  # alpha_share * alpha_test
    rejected: bool
    within_margin: bool


@dataclass(frozen=True)
class Design:
    """The looks and levels of one test; see the module docstring."""

    alpha: float  # the run's alpha (family-wise)
    family_size: int  # clean tests in the run (1 for a canary or a lone `pdcheck compare`)
    margin_pts: float
    looks: tuple[Look, ...]

    @classmethod
    def plan(
        cls,
        planned_pairs: int,
        *,
        alpha: float,
        margin_pts: float,
        family_size: int = 1,
        early_stop: bool = False,
    ) -> Design:
        """The design for a test of `planned_pairs` pairs (questions × repeats)."""
        if not 0 < alpha < 0.5:
            raise ValueError(f"alpha must be in (0, 0.5), got {alpha}")
        if family_size < 1:
            raise ValueError(f"family_size must be at least 1, got {family_size}")
        n = max(int(planned_pairs), 1)
        looks: list[Look] = []
        if early_stop:
            looks += [Look(p, EARLY_SHARE, False) for p in EARLY_LOOK_PAIRS if p < n]
            last = looks[-1].pairs if looks else 0
            for f in QUARTER_FRACTIONS:
                p = round(f * n)
                if last < p < n:
                    looks.append(Look(p, QUARTER_SHARE, True))
                    last = p
        final_share = 1.0 - sum(look.alpha_share for look in looks)
        looks.append(Look(n, final_share, True))
        return cls(alpha=alpha, family_size=family_size, margin_pts=margin_pts, looks=tuple(looks))

    @property
    def alpha_test(self) -> float:
        return self.alpha / self.family_size

    @property
    def equivalence_alpha(self) -> float:
        return self.alpha / sum(look.equivalence for look in self.looks)

    @property
    def planned_pairs(self) -> int:
        return self.looks[-1].pairs

    @property
    def interim(self) -> tuple[Look, ...]:
        return self.looks[:-1]

    def within_margin(self, worse: npt.ArrayLike, better: npt.ArrayLike, n: npt.ArrayLike) -> Bools:
        """The drop's upper bound (at `equivalence_alpha`) is at most the margin: PASS is shown."""
        return drop_within_margin(
            worse, better, n, margin_pts=self.margin_pts, alpha=self.equivalence_alpha
        )

    def rejects(
        self,
        look: int,
        worse: npt.ArrayLike,
        better: npt.ArrayLike,
        n: npt.ArrayLike,
        *,
        alpha_test: float | None = None,
        within: Bools | None = None,
        p_values: npt.ArrayLike | None = None,
    ) -> Bools:
        """Look `look` rejects "no drop" at `alpha_test` (default alpha/F) and the margin is not
        shown (`within`: `within_margin` of the same counts, and `p_values`: their McNemar
        p-values, when the caller has them)."""
        level = self.looks[look].alpha_share * (
            self.alpha_test if alpha_test is None else alpha_test
        )
        p = mcnemar_worse_p(worse, better) if p_values is None else np.asarray(p_values)
        significant = p <= level
        if within is None:
            within = self.within_margin(worse, better, n)
        return np.asarray(significant & ~within, dtype=np.bool_)

    def sequential_p(self, outcomes: tuple[LookOutcome, ...]) -> float:
        """min over the reached looks of p_k / s_k, leaving out looks that showed the margin; ≤ 1."""
        ratios = [
            o.p_value / self.looks[o.look].alpha_share for o in outcomes if not o.within_margin
        ]
        return min([1.0, *ratios])

    def outcome(self, look: int, worse: int, better: int, n: int) -> LookOutcome:
        p = float(mcnemar_worse_p(worse, better))
        within = bool(self.within_margin(worse, better, n))
        threshold = self.looks[look].alpha_share * self.alpha_test
        return LookOutcome(
            look=look,
            n_pairs=n,
            worse=worse,
            better=better,
            p_value=p,
            threshold=threshold,
            rejected=p <= threshold and not within,
            within_margin=within,
        )
