"""`pdcheck compare BASELINE.jsonl PD.jsonl`: the whole paired analysis of two record files.

Exit code follows the verdict: 0 PASS or NO-DROP-SHOWN, 1 REGRESSION or SUSPECT, 2 INFRA-ERROR, 3 bad input (a
malformed file, named with its line, or files over different questions). INCONCLUSIVE exits 1
("we could not tell" is not green), or 0 with a warning on stderr under `--allow-inconclusive`;
either way the line says why.
"""

from __future__ import annotations

import json
import math

import click
import msgspec
from rich.table import Table

from pdcheck.analysis import (
    PairedComparison,
    Verdict,
    compare_paired,
    decide,
    divergence_precision,
)
from pdcheck.analysis.design import Design
from pdcheck.analysis.injection import injected_indices
from pdcheck.analysis.sequential import sequential_result
from pdcheck.analysis.verdict import LevelEvidence, gate_exit_code, interval_confidence
from pdcheck.cli._common import console, err_console
from pdcheck.config import AnalysisPolicy
from pdcheck.contracts.plugin_files import InjectionRecord
from pdcheck.errors import InputFileError
from pdcheck.evals.jsonl import read_jsonl
from pdcheck.evals.records import read_records

_FILE = click.Path(exists=True, dir_okay=False)


def _finite(ctx: click.Context, param: click.Parameter, value: float | None) -> float | None:
    """NaN passes every range check (each comparison is false) and inf some: refuse both (exit 3)."""
    if value is not None and not math.isfinite(value):
        raise click.BadParameter(f"must be a finite number, got {value}")
    return value


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.2f}%"


def _pts(x: float | None) -> str:
    return "-" if x is None else f"{x:+.2f}"


def _tables(c: PairedComparison) -> list[Table]:
    sides = Table(title="Sides")
    for col in ("side", "records", "ok", "errors", "accuracy", "invalid", "runs mean ± std"):
        sides.add_column(col)
    for name, s, mean, std in (
        ("baseline", c.baseline, c.jitter.baseline_mean, c.jitter.baseline_std),
        ("pd", c.pd, c.jitter.pd_mean, c.jitter.pd_std),
    ):
        runs = "-" if mean is None or std is None else f"{100 * mean:.2f} ± {100 * std:.2f}"
        sides.add_row(
            name,
            str(s.n_records),
            str(s.n_ok),
            str(s.n_errors),
            _pct(s.accuracy),
            _pct(s.invalid_rate),
            runs,
        )

    paired = Table(
        title=f"Paired (n={c.n_pairs}, every repeat; accuracy CI ≥"
        f"{100 * interval_confidence(c.alpha):g}% as proven (each end one-sided at alpha), "
        "one-sided exact McNemar; the verdict's reason gives the test's own level)"
    )
    for col in ("metric", "Δ pts (PD − baseline)", "CI low", "CI high", "p / counts"):
        paired.add_column(col)
    paired.add_row(
        "accuracy",
        _pts(c.delta_pts),
        _pts(c.ci_low_pts),
        _pts(c.ci_high_pts),
        f"p={c.p_value:.3g} ({c.worse} PD-worse, {c.better} PD-better)",
    )
    paired.add_row(
        "invalid rate",
        _pts(c.delta_invalid_pts),
        _pts(c.invalid_ci_low_pts),
        _pts(c.invalid_ci_high_pts),
        f"{c.invalid_worse} newly invalid, {c.invalid_better} fixed",
    )
    paired.add_row(
        "power",
        f"MDE {c.power.mde_pts:.2f}",
        "",
        "",
        f"n needed for {c.power.margin_pts:g} pts: {c.power.n_needed_for_margin}",
    )

    a = c.agreement
    agree = Table(
        title=f"Greedy agreement (tie ε = {a.tie_epsilon_nats:g} nats, positions in {a.position_unit})"
    )
    for col in (
        "identical",
        "tie flips",
        "corruption-grade",
        "unclassified",
        "first divergence p50 / p90",
        "histogram",
    ):
        agree.add_column(col)
    hist = " ".join(f"{k}:{v}" for k, v in a.position_histogram.items() if v)
    positions = " / ".join("-" if p is None else f"{p:g}" for p in (a.position_p50, a.position_p90))
    agree.add_row(
        f"{a.n_identical}/{a.n_pairs}",
        str(a.n_tie),
        str(a.n_corruption),
        str(a.n_unclassified),
        positions,
        hist or "-",
    )
    if c.control is not None:
        ct = c.control
        agree.caption = (
            f"vs {ct.source}: {ct.pd_count}/{ct.pd_pairs} {ct.basis} in PD, "
            f"{ct.control_count}/{ct.control_pairs} in control, one-sided Fisher p={ct.p_value:.3g}"
        )
    return [sides, paired, agree]


def _injected_ids(path: str, *, run_tag: str | None) -> list[str]:
    """The X-Request-Ids of the injection log, each checked to name a question, or InputFileError."""
    ids = []
    for number, entry in read_jsonl(path, InjectionRecord, what="an injection record"):
        try:
            injected_indices([entry.x_request_id], run_tag=run_tag)
        except ValueError as exc:
            raise InputFileError(str(exc), path=path, line=number) from None
        ids.append(entry.x_request_id)
    return ids


@click.command()
@click.argument("baseline", type=_FILE)
@click.argument("pd", type=_FILE)
@click.option(
    "--margin-pts",
    type=click.FloatRange(0, 100),
    default=2.0,
    show_default=True,
    help="PD may lose up to this many accuracy points: a significant drop fails unless the run's "
    "exact bound shows it within the margin.",
    callback=_finite,
)
@click.option(
    "--alpha",
    type=click.FloatRange(0, 0.5, min_open=True, max_open=True),
    default=0.05,
    show_default=True,
    help="Type-I error of the one-sided tests; each CI end is a one-sided bound at alpha, so "
    "the interval holds with at least 1 - 2.2*alpha (the lower end's proof costs 0.2*alpha).",
    callback=_finite,
)
@click.option(
    "--tie-epsilon",
    type=click.FloatRange(0),
    default=0.05,
    show_default=True,
    help="Top-2 logprob margin (nats) below which a first divergence is a near-tie flip.",
    callback=_finite,
)
@click.option(
    "--baseline-repeat",
    "baseline_repeats",
    type=_FILE,
    multiple=True,
    help="Another baseline run of the same questions: the SUSPECT control (with the next "
    "repeats), and the pair of the --pd-repeat at its position.",
)
@click.option(
    "--pd-repeat",
    "pd_repeats",
    type=_FILE,
    multiple=True,
    help="Another PD run, paired with the --baseline-repeat of the same position: its pairs join "
    "the test (give one --baseline-repeat per --pd-repeat).",
)
@click.option(
    "--control", type=_FILE, help="Agreement control run, e.g. PD with async scheduling off."
)
@click.option(
    "--expected-accuracy",
    type=click.FloatRange(0, 1),
    help="Stored accuracy for vLLM's |acc - expected| < rtol check (information only).",
    callback=_finite,
)
@click.option(
    "--expected-rtol",
    type=click.FloatRange(0, 1, min_open=True),
    default=0.05,
    show_default=True,
    help="Tolerance of that check.",
    callback=_finite,
)
@click.option(
    "--early-stop", is_flag=True, help="Also report where the sequential test would have stopped."
)
@click.option(
    "--allow-inconclusive",
    is_flag=True,
    help="Exit 0 (with a warning) on INCONCLUSIVE instead of 1.",
)
@click.option(
    "--no-drop-shown-fails",
    is_flag=True,
    help="Exit 1 on NO-DROP-SHOWN (powered, not flagged, but the drop not shown within the "
    "margin) instead of 0, as `analysis.allow_no_drop_shown: false` does in a sweep.",
)
@click.option(
    "--injections",
    type=_FILE,
    help="The plugin's injections.jsonl: precision/recall of the corruption-grade divergences "
    "(every divergence when no logprobs were recorded).",
)
@click.option("--run-tag", help="Only injections of this run tag (X-Request-Id prefix) count.")
@click.option(
    "--json", "as_json", is_flag=True, help="Print the analysis as JSON instead of tables."
)
def compare(
    baseline,
    pd,
    margin_pts,
    alpha,
    tie_epsilon,
    baseline_repeats,
    pd_repeats,
    control,
    expected_accuracy,
    expected_rtol,
    early_stop,
    allow_inconclusive,
    no_drop_shown_fails,
    injections,
    run_tag,
    as_json,
) -> None:
    """Compare BASELINE and PD record files question by question and print the verdict.

    \b
    Exit: 0 PASS and NO-DROP-SHOWN (unless --no-drop-shown-fails), 1 REGRESSION or SUSPECT
    (and INCONCLUSIVE unless --allow-inconclusive), 2 INFRA-ERROR, 3 a file is malformed (the message names it and the
    line) or the files cover different questions.
    """
    policy = AnalysisPolicy(
        margin_pts=margin_pts,
        alpha=alpha,
        tie_epsilon_nats=tie_epsilon,
        early_stop=early_stop,
        allow_inconclusive=allow_inconclusive,
        allow_no_drop_shown=not no_drop_shown_fails,
    )
    base_runs = [read_records(p) for p in (baseline, *baseline_repeats)]
    pd_runs = [read_records(p) for p in (pd, *pd_repeats)]
    base_records, pd_records = base_runs[0], pd_runs[0]
    comparison = compare_paired(
        base_records,
        pd_records,
        alpha=alpha,
        tie_epsilon_nats=tie_epsilon,
        margin_pts=margin_pts,
        baseline_repeats=base_runs[1:],
        pd_repeats=pd_runs[1:],
        control=read_records(control) if control else None,
        expected_accuracy=expected_accuracy,
        expected_rtol=expected_rtol,
    )
    # The sweep's judging builds the same evidence from its store; record files carry no KV
    # evidence, so a lone comparison has none.
    verdict = decide(LevelEvidence(comparison=comparison), policy=policy)
    stop = (
        sequential_result(
            list(zip(base_runs, pd_runs, strict=False)),
            Design.plan(
                comparison.n_pairs,
                alpha=alpha,
                margin_pts=margin_pts,
                family_size=verdict.design.family_size if verdict.design else 1,
                early_stop=True,
            ),
        ).stop
        if early_stop
        else None
    )
    precision = None
    if injections:
        precision = divergence_precision(
            _injected_ids(injections, run_tag=run_tag),
            comparison.agreement,
            run_tag=run_tag,
            questions=[r.index for r in pd_records],
        )
    if as_json:
        click.echo(
            json.dumps(
                msgspec.to_builtins(
                    {
                        "comparison": comparison,
                        "verdict": verdict,
                        "early_stop": stop,
                        "injection_precision": precision,
                    }
                ),
                indent=2,
            )
        )
    else:
        for table in _tables(comparison):
            console.print(table)
        if comparison.compatibility is not None:
            cp = comparison.compatibility
            console.print(
                f"vLLM-style check (information only): |{cp.pd_accuracy:.4f} − {cp.expected_accuracy:.4f}| "
                f"< {cp.rtol:g} → {'pass' if cp.passed else 'FAIL'}"
            )
        if early_stop:
            console.print(
                f"early stop: {stop.reason}" if stop else "early stop: would not have stopped early"
            )
        if precision is not None:
            console.print(
                f"injections: {precision.n_true_positive}/{precision.n_injected} injected questions diverged "
                f"(recall {_pct(precision.recall)}), precision {_pct(precision.precision)} "
                f"of {precision.n_flagged} divergences"
            )
        console.print(f"[bold]{verdict.verdict.value}[/bold]: {verdict.reason}")
    if verdict.verdict is Verdict.INCONCLUSIVE:
        err_console.print(
            f"{'warning' if allow_inconclusive else 'error'}: INCONCLUSIVE, we could not tell "
            f"whether PD lost more than {margin_pts:g} points; {verdict.reason}"
            + ("" if allow_inconclusive else " (exit 1; --allow-inconclusive exits 0)")
        )
    if verdict.verdict is Verdict.NO_DROP_SHOWN:
        err_console.print(
            f"{'error' if no_drop_shown_fails else 'warning'}: NO-DROP-SHOWN is not a PASS: no "
            f"drop was shown, but neither was a drop within {margin_pts:g} points"
            + (" (exit 1 under --no-drop-shown-fails)" if no_drop_shown_fails else "")
        )
    code = gate_exit_code(
        verdict.verdict,
        allow_inconclusive=allow_inconclusive,
        allow_no_drop_shown=not no_drop_shown_fails,
    )
    raise click.exceptions.Exit(int(code))
