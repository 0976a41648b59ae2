"""The gate's operating characteristics, and vLLM's ± 0.05 gate on the same drops (issue 17).

Every figure states its n and d (the discordance: the share of questions PD and the baseline
answer differently, in the run with the drop in it). The README and docs/analysis.md quote
this script's output; rerun it after changing `pdcheck/analysis/design.py`.

- pdcheck: the exact probability (`power.operating`, the law of the design carried look to
  look) that a cell is flagged, for a lone test (a canary, `pdcheck compare`) and for one test
  of a 24-test clean family (default-gpu: Holm's first step, alpha/24), early stop off and on;
  the chance a clean default-gpu sweep fails; the expected questions early stop saves.
- The rule before issue 17 (p < alpha and the observed drop > margin, alpha per test, no
  family): its exact chance of failing a clean 24-test sweep, for comparison.
- vLLM's gate: PD's accuracy against a stored number, |acc − stored| < 0.05 passes. The stored
  number is an earlier run of the baseline, so it differs from this run's baseline accuracy by
  the run-to-run std vLLM measured, 0.0033 (#37310). PD's accuracy comes from the same paired
  table as pdcheck's test. Monte Carlo, 200,000 cells per row, seeded.

    .venv/bin/python benchmarks/gate_comparison.py [--n 1319] [--json]
"""

from __future__ import annotations

import argparse
import json

import numpy as np
from scipy import stats

from pdcheck.analysis.design import Design
from pdcheck.analysis.power import drop_probabilities, operating
from pdcheck.analysis.stats import mcnemar_worse_p

ALPHA = 0.05
MARGIN_PTS = 2.0
FAMILY = 24
ACCURACY = 0.84  # the baseline's accuracy in the vLLM comparison (Qwen-class GSM8K)
VLLM_RUN_STD = 0.0033
VLLM_TOLERANCE = 0.05


def _design(n: int, family: int, early_stop: bool) -> Design:
    return Design.plan(
        n, alpha=ALPHA, margin_pts=MARGIN_PTS, family_size=family, early_stop=early_stop
    )


def pdcheck_flag(n: int, d: float, drop: float, family: int, early_stop: bool) -> float:
    p_worse, p_better = drop_probabilities(d, drop) if drop > 0 else (d / 2, d / 2)
    return operating(_design(n, family, early_stop), p_worse=p_worse, p_better=p_better).flag


def old_rule_null_flag(n: int, d: float) -> float:
    """P(p < alpha and observed drop > margin) with no drop: the rule before issue 17, exactly."""
    w = np.arange(n + 1)[:, None]
    b = np.arange(n + 1)[None, :]
    ok = w + b <= n
    pw = stats.binom.pmf(w, n, d / 2)
    pb = stats.binom.pmf(b, np.maximum(n - w, 0), (d / 2) / (1 - d / 2))
    flag = (mcnemar_worse_p(w, b) < ALPHA) & (100.0 * (w - b) / n > MARGIN_PTS) & ok
    return float((pw * pb * flag).sum())


def vllm_catch(n: int, d: float, drop: float, rng: np.random.Generator, cells: int) -> float:
    """P(|acc_PD − stored| ≥ 0.05): vLLM's gate fails the run."""
    p_worse, p_better = drop_probabilities(d, drop) if drop > 0 else (d / 2, d / 2)
    both = ACCURACY - p_worse
    table = rng.multinomial(n, [both, p_worse, p_better, 1 - both - p_worse - p_better], cells)
    base_acc = (table[:, 0] + table[:, 1]) / n
    pd_acc = (table[:, 0] + table[:, 2]) / n
    stored = base_acc + rng.normal(0.0, VLLM_RUN_STD, cells)
    return float((np.abs(pd_acc - stored) >= VLLM_TOLERANCE).mean())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--n", type=int, default=1319, help="questions per test (GSM8K: 1319)")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead")
    args = parser.parse_args()
    n = args.n
    rng = np.random.default_rng(34333)
    out: dict[str, object] = {"n": n, "alpha": ALPHA, "margin_pts": MARGIN_PTS, "family": FAMILY}

    drops = (0.0, 0.02, 0.03, 0.05, 0.07)
    vllm_d = (2 * VLLM_RUN_STD**2 * n, 0.05, 0.15)
    catch = []
    for d in vllm_d:
        for drop in drops:
            catch.append(
                {
                    "d": round(d, 4),
                    "drop_pts": 100 * drop,
                    "pdcheck_alone": pdcheck_flag(n, d, drop, 1, False),
                    "pdcheck_in_24": pdcheck_flag(n, d, drop, FAMILY, False),
                    "pdcheck_in_24_early_stop": pdcheck_flag(n, d, drop, FAMILY, True),
                    "vllm_abs_0.05": vllm_catch(n, d, drop, rng, 200_000),
                }
            )
    out["catch"] = catch

    sweep = []
    for d in (0.02, 0.05, 0.15, 0.40):
        row: dict[str, float] = {"d": d}
        for early_stop in (False, True):
            for repeats in (1, 3):
                design = _design(n * repeats, FAMILY, early_stop)
                o = operating(design, p_worse=d / 2, p_better=d / 2)
                key = f"{'early' if early_stop else 'full'}_r{repeats}"
                row[f"fails_{key}"] = 1 - (1 - o.flag) ** FAMILY
                if early_stop:
                    row[f"saved_{key}"] = 1 - o.expected_pairs / design.planned_pairs
        row["fails_before_issue_17_full_r1"] = 1 - (1 - old_rule_null_flag(n, d)) ** FAMILY
        sweep.append(row)
    out["clean_sweep"] = sweep

    power = []
    for d in (0.02, 0.05, 0.10, 0.15):
        for extra in (1.0, 2.0, 3.0):
            drop = (MARGIN_PTS + extra) / 100
            power.append(
                {
                    "d": d,
                    "drop_pts": 100 * drop,
                    "alone": pdcheck_flag(n, d, drop, 1, False),
                    "in_24": pdcheck_flag(n, d, drop, FAMILY, False),
                    "in_24_early_stop": pdcheck_flag(n, d, drop, FAMILY, True),
                }
            )
    out["power"] = power

    if args.json:
        print(json.dumps(out))
        return
    print(f"n = {n} questions, alpha {ALPHA}, margin {MARGIN_PTS} pts; d = discordance\n")
    print("Chance a cell with a true drop is flagged (pdcheck exact; vLLM Monte Carlo)\n")
    print("| d | drop | pdcheck alone | pdcheck, 1 of 24 | same, early stop | vLLM ± 0.05 |")
    print("| --- | --- | --- | --- | --- | --- |")
    for r in catch:
        print(
            f"| {100 * r['d']:.2f}% | {r['drop_pts']:g} pts | {100 * r['pdcheck_alone']:.2f}% | "
            f"{100 * r['pdcheck_in_24']:.2f}% | {100 * r['pdcheck_in_24_early_stop']:.2f}% | "
            f"{100 * r['vllm_abs_0.05']:.2f}% |"
        )
    print("\nA clean 24-test sweep (default-gpu): chance it fails, and questions saved\n")
    print(
        "| d | before issue 17 | full n | full n, 3 repeats | early stop | early stop, 3 repeats "
        "| saved (early stop) | saved, 3 repeats |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in sweep:
        print(
            f"| {100 * r['d']:g}% | {100 * r['fails_before_issue_17_full_r1']:.1f}% | "
            f"{100 * r['fails_full_r1']:.2f}% | {100 * r['fails_full_r3']:.2f}% | "
            f"{100 * r['fails_early_r1']:.2f}% | {100 * r['fails_early_r3']:.2f}% | "
            f"{100 * r['saved_early_r1']:.0f}% | {100 * r['saved_early_r3']:.0f}% |"
        )
    print("\nPower rule: P(flag | drop = margin + extra), exact\n")
    print("| d | drop | alone | 1 of 24 | 1 of 24, early stop |")
    print("| --- | --- | --- | --- | --- |")
    for r in power:
        print(
            f"| {100 * r['d']:g}% | {r['drop_pts']:g} pts | {100 * r['alone']:.1f}% | "
            f"{100 * r['in_24']:.1f}% | {100 * r['in_24_early_stop']:.1f}% |"
        )


if __name__ == "__main__":
    main()
