"""Proof by simulation that the statistics hold their error rates, using the verdict's own rule.

Cells are simulated as counts of the paired 2x2 table (both right, PD-worse, PD-better, both
wrong): i.i.d. questions with correlated outcomes. `regression_mask` is the exact function
`decide` applies, so these rates are the gate's. Run with `-s` to see the measured rates
(quoted in docs/analysis.md).
"""

from __future__ import annotations

import json

import numpy as np

from pdcheck.analysis import Verdict, compare_paired, decide
from pdcheck.analysis.sequential import log_mixture_ratio
from pdcheck.analysis.verdict import regression_mask
from pdcheck.config import AnalysisPolicy
from tests.unit.analysis.builders import paired_sides

ALPHA = 0.05
MARGIN_PTS = 2.0
N_GSM8K = 1319
# vLLM's 5-run table: std 0.0033 of accuracy across runs (#37310). Two runs of one configuration
# then differ by sqrt(2)*0.0033, which at n questions needs a discordance of 2 * 0.0033**2 * n.
VLLM_RUN_STD = 0.0033
VLLM_DISCORDANCE = 2 * VLLM_RUN_STD**2 * N_GSM8K


def _null_cells(rng, cells: int):
    """Accuracy 0.3-0.9, discordance 2-15%, n 100-1319, PD exactly as good as the baseline."""
    acc = rng.uniform(0.3, 0.9, cells)
    disc = rng.uniform(0.02, 0.15, cells)
    n = rng.integers(100, N_GSM8K + 1, cells)
    worse = rng.binomial(n, disc / 2)
    better = rng.binomial(n - worse, (disc / 2) / (1 - disc / 2))
    return acc, disc, n, worse, better


def test_regression_rate_under_the_null_is_at_most_alpha_plus_one_point():
    """Over 2,000 null cells REGRESSION happens at most alpha + 1 point, with the margin and without it."""
    rng = np.random.default_rng(2026)
    _, _, n, worse, better = _null_cells(rng, 2000)
    with_margin = regression_mask(worse, better, n, alpha=ALPHA, margin_pts=MARGIN_PTS).mean()
    no_margin = regression_mask(worse, better, n, alpha=ALPHA, margin_pts=0.0).mean()
    print(
        json.dumps(
            {"null_regression_rate": float(with_margin), "null_rate_margin_0": float(no_margin)}
        )
    )
    assert no_margin <= ALPHA + 0.01
    assert with_margin <= ALPHA + 0.01


def test_simulated_cells_agree_with_decide_on_records():
    """The vectorized rule and `decide` on real records give the same verdict, cell by cell."""
    rng = np.random.default_rng(5)
    for _ in range(40):
        n = int(rng.integers(50, 400))
        worse, better = (int(x) for x in rng.multinomial(n, [0.07, 0.03, 0.9])[:2])
        base, pd = paired_sides(both=n - worse - better, worse=worse, better=better, neither=0)
        v = decide(
            compare_paired(base, pd), policy=AnalysisPolicy(margin_pts=MARGIN_PTS, alpha=ALPHA)
        )
        expected = bool(regression_mask(worse, better, n, alpha=ALPHA, margin_pts=MARGIN_PTS))
        assert (v.verdict is Verdict.REGRESSION) == expected, (n, worse, better, v)


def _drop_cells(rng, cells: int, drop: float, disc0: float, acc: float = 0.84):
    """Cells where PD loses `drop` of the questions on top of the null discordance `disc0`."""
    p = [acc - disc0 / 2 - drop, disc0 / 2 + drop, disc0 / 2, 1 - acc - disc0 / 2]
    table = rng.multinomial(N_GSM8K, p, size=cells)
    base_acc = (table[:, 0] + table[:, 1]) / N_GSM8K
    pd_acc = (table[:, 0] + table[:, 2]) / N_GSM8K
    return table[:, 1], table[:, 2], base_acc, pd_acc


def test_five_point_drop_is_caught_at_vllm_discordance_and_vllm_gates_compared():
    """A 5-point drop at n=1319 is REGRESSION in >= 90% of cells; vLLM's stored-number gates are measured too."""
    rng = np.random.default_rng(37310)
    cells = 2000
    worse, better, base_acc, pd_acc = _drop_cells(rng, cells, 0.05, VLLM_DISCORDANCE)
    caught = regression_mask(worse, better, N_GSM8K, alpha=ALPHA, margin_pts=MARGIN_PTS).mean()
    # vLLM compares with a number stored from an earlier run: that run's accuracy, with its jitter.
    stored = base_acc + rng.normal(0, VLLM_RUN_STD, cells)
    vllm_two_sided = (np.abs(pd_acc - stored) >= 0.05).mean()
    vllm_one_sided_008 = (pd_acc < stored - 0.08).mean()
    # The same gates under the null, for their false-alarm rates.
    w15, b15, _, _ = _drop_cells(rng, cells, 0.05, 0.15)
    caught_at_15 = regression_mask(w15, b15, N_GSM8K, alpha=ALPHA, margin_pts=MARGIN_PTS).mean()
    w0, b0, base0, pd0 = _drop_cells(rng, cells, 0.0, VLLM_DISCORDANCE)
    stored0 = base0 + rng.normal(0, VLLM_RUN_STD, cells)
    print(
        json.dumps(
            {
                "discordance": round(VLLM_DISCORDANCE, 4),
                "pdcheck_catch_5pt": float(caught),
                "pdcheck_catch_5pt_at_discordance_0.15": float(caught_at_15),
                "vllm_abs_0.05_catch_5pt": float(vllm_two_sided),
                "vllm_one_sided_0.08_catch_5pt": float(vllm_one_sided_008),
                "pdcheck_false_alarm": float(
                    regression_mask(w0, b0, N_GSM8K, alpha=ALPHA, margin_pts=MARGIN_PTS).mean()
                ),
                "vllm_abs_0.05_false_alarm": float((np.abs(pd0 - stored0) >= 0.05).mean()),
            }
        )
    )
    assert caught >= 0.90
    assert caught_at_15 >= 0.90
    assert caught > vllm_two_sided


def test_early_stop_keeps_type_one_error_under_the_null():
    """Checked after every question of 2,000 null cells (n=1319), the early stop fires at most alpha."""
    rng = np.random.default_rng(99)
    cells = 2000
    disc = rng.uniform(0.02, 0.15, (cells, 1))
    u = rng.random((cells, N_GSM8K))
    worse = np.cumsum(u < disc / 2, axis=1)
    better = np.cumsum((u >= disc / 2) & (u < disc), axis=1)
    n = np.arange(1, N_GSM8K + 1)
    # The ratio depends only on (worse, discordant): look it up instead of evaluating 2.6M times.
    m_max = int((worse + better).max())
    k_grid, m_grid = np.meshgrid(np.arange(m_max + 1), np.arange(m_max + 1))
    table = np.where(
        k_grid <= m_grid, log_mixture_ratio(np.minimum(k_grid, m_grid), m_grid), -np.inf
    )
    crossed = table[worse + better, worse] >= np.log(1 / ALPHA)
    stops = (crossed & (100.0 * (worse - better) / n > MARGIN_PTS)).any(axis=1).mean()
    stops_no_margin = crossed.any(axis=1).mean()
    print(
        json.dumps(
            {
                "early_stop_null_rate": float(stops),
                "early_stop_null_rate_margin_0": float(stops_no_margin),
            }
        )
    )
    assert stops_no_margin <= ALPHA + 0.01
    assert stops <= ALPHA + 0.01


def test_collapse_stops_early():
    """A 0.86 -> 0.11 collapse (independent sides) is stopped well under 100 questions in every cell."""
    rng = np.random.default_rng(86)
    cells, horizon = 2000, 100
    base = rng.random((cells, horizon)) < 0.86
    pd = rng.random((cells, horizon)) < 0.11
    worse = np.cumsum(base & ~pd, axis=1)
    better = np.cumsum(pd & ~base, axis=1)
    n = np.arange(1, horizon + 1)
    stop = (log_mixture_ratio(worse, worse + better) >= np.log(1 / ALPHA)) & (
        100.0 * (worse - better) / n > MARGIN_PTS
    )
    assert stop.any(axis=1).all()
    first = stop.argmax(axis=1) + 1
    print(
        json.dumps(
            {
                "collapse_stop_median_n": float(np.median(first)),
                "collapse_stop_max_n": int(first.max()),
            }
        )
    )
    assert first.max() < 40
