"""The margin decision's promise, exactly: at a true drop of exactly the margin, a test says
"within the margin" with probability at most alpha, for every design a shipped sweep plans.

`power.operating` carries the design's exact law look to look (the decision rule itself, not an
approximation); P(called within) is the interim looks' PASS-within stops plus the last look's
within. The bound (`stats.drop_bounds`) is proven for every discordance; this checks the claim
on a grid of discordances from d = the margin (every discordant pair PD-worse, where Tango's
interval was worst) to d = 0.4, for the shipped designs of up to 500 pairs and a small unshipped
one; `tests/slow/test_margin_bound_exact.py` runs every shipped design up to d = 1.
"""

from __future__ import annotations

import pytest

from pdcheck.analysis.design import Design
from pdcheck.analysis.power import operating
from pdcheck.analysis.stats import drop_bounds
from pdcheck.config import expand_cells, load_sweep
from pdcheck.config.load import SWEEPS_DIR
from pdcheck.sweep.judging import clean_level_designs, clean_tests

DISCORDANCE_FACTORS = (1.0, 1.02, 1.1, 1.3, 1.6, 2.0, 3.0, 5.0)
DISCORDANCES = (0.05, 0.1, 0.2, 0.4)
# Larger designs take minutes on the grid; the slow tier checks them.
UNIT_MAX_PAIRS = 500


def shipped_designs() -> dict[str, Design]:
    """Each distinct clean design the shipped sweep files plan, by file and planned pairs."""
    designs: dict[str, Design] = {}
    for path in sorted(SWEEPS_DIR.glob("*.yaml")):
        cells = expand_cells(load_sweep(str(path)))
        for _cell, _c, design in clean_level_designs(cells, family_size=clean_tests(cells)):
            designs.setdefault(f"{path.stem}: {design.planned_pairs} pairs", design)
    return designs


SHIPPED = shipped_designs()
SMALL = {name: d for name, d in SHIPPED.items() if d.planned_pairs <= UNIT_MAX_PAIRS}
SMALL["133 pairs, one look"] = Design.plan(133, alpha=0.05, margin_pts=2.0)


def worst_called_within(design: Design, discordances: tuple[float, ...]) -> float:
    """max over the grid of the exact P(called within | drop = margin)."""
    drop = design.margin_pts / 100
    grid = sorted(
        {min(1.0, f * drop) for f in DISCORDANCE_FACTORS} | {d for d in discordances if d > drop}
    )
    worst = 0.0
    for d in grid:
        o = operating(design, p_worse=(d + drop) / 2, p_better=(d - drop) / 2)
        worst = max(worst, o.within + o.within_end)
    return worst


@pytest.mark.parametrize("name", sorted(SMALL))
def test_a_drop_of_the_margin_is_called_within_at_most_alpha(name):
    """Exact P(called within | drop = margin) ≤ alpha at every discordance on the grid."""
    design = SMALL[name]
    worst = worst_called_within(design, DISCORDANCES)
    assert worst <= design.alpha, (name, worst)


def test_shipped_sweeps_are_all_checked():
    """Every shipped sweep file has a clean design in the check (here or in the slow tier)."""
    assert {name.split(":")[0] for name in SHIPPED} == {p.stem for p in SWEEPS_DIR.glob("*.yaml")}


def test_no_discordant_pair_in_133_is_not_shown_within_two_points():
    """0 discordant pairs in 133: the exact 95% bound on the drop is above 2 points (the
    Clopper-Pearson bound for 0/133 alone is 2.23), so it is not "within" a 2-point margin
    (Tango's interval said 1.99: PASS "within the margin")."""
    _, up = drop_bounds(0, 0, 133, alpha=0.05)
    assert float(up) > 0.0223
    assert not Design.plan(133, alpha=0.05, margin_pts=2.0).within_margin(0, 0, 133)


def test_the_interval_excludes_no_drop_only_when_the_test_rejects():
    """W = 4, B = 0: p = 0.0625 > 0.05, so the one-sided 95% lower bound on the drop is ≤ 0
    (Tango's 90% interval was [−0.67, −0.10], excluding 0 while the test did not reject)."""
    low, _ = drop_bounds(4, 0, 600, alpha=0.05)
    assert float(low) <= 0.0
    low, _ = drop_bounds(8, 0, 600, alpha=0.05)  # p = 0.0039
    assert float(low) > 0.0
