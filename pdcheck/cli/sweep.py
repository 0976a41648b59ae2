"""`pdcheck sweep` and `pdcheck merge`: parse, one library call, render with rich."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import click
from rich.live import Live
from rich.table import Table
from rich.text import Text

from pdcheck.cli._common import console, err_console
from pdcheck.cli.validate import list_option, shipped_sweeps_table
from pdcheck.errors import ConfigError, ExitCode

if TYPE_CHECKING:
    from pdcheck.results.load import RunResults

EXIT_CODES_HELP = """
\b
Exit codes:
  0  every cell PASS and every canary flagged (and the race harness clean)
  1  a REGRESSION or SUSPECT, or a canary that was not flagged (or race findings),
     or an INCONCLUSIVE cell unless analysis.allow_inconclusive is true
  2  infra error: servers failed, no KV transferred, the harness could not run
  3  bad sweep file or options; nothing was started
When both 1 and 2 apply, the exit code is 1.
"""


@click.command(
    help="Run a sweep: each cell's PD topology against its no-PD baseline at every "
    "concurrency level, with verdicts, into a results folder.\n\nFILE is a sweep file or a shipped "
    "sweep's name (see --list); without it, default-gpu on GPU machines, else cpu-smoke.\n"
    + EXIT_CODES_HELP
)
@click.argument("file", required=False)
@click.option(
    "--out",
    type=click.Path(path_type=Path),
    help="Results folder (new). Default: pdcheck-results/<sweep>-<time>.",
)
@click.option(
    "--resume",
    type=click.Path(path_type=Path),
    help="Continue an interrupted run folder: only missing units run.",
)
@click.option(
    "--shard",
    metavar="I/N",
    help="Run shard I of N (1-based; cells split by id hash). Join with `pdcheck merge`.",
)
@click.option("--only", multiple=True, metavar="NAME|ID", help="Only these cells (repeatable).")
@click.option(
    "-k",
    "keyword",
    metavar="EXPR",
    help="Only cells whose name matches: words joined by 'and', 'not word'.",
)
@click.option(
    "--dry-run",
    is_flag=True,
    help="Print the cells and every server's argv and env; start nothing.",
)
@click.option(
    "--check-argv/--no-check-argv",
    default=True,
    show_default=True,
    help="With --dry-run: run each distinct `vllm serve` argv through vLLM's own parser.",
)
@click.option(
    "--gpus",
    type=click.IntRange(min=0),
    metavar="N",
    help="With --dry-run: plan for N GPUs (0..N-1) instead of this machine's, e.g. to check a GPU sweep on a laptop.",
)
@click.option(
    "--early-stop",
    is_flag=True,
    help=(
        "Look at each test a few times (30 and 60 questions, each quarter): stop once REGRESSION "
        "or PASS is certain, at the same alpha, and skip a flagged cell's higher levels."
    ),
)
@click.option(
    "--continue-on-error/--fail-fast",
    default=True,
    show_default=True,
    help="On an infra failure, mark that cell INFRA-ERROR and go on, or stop the sweep.",
)
@click.option(
    "--backend",
    type=click.Choice(["local", "ray"]),
    help="Where the servers run: this machine (local), or the nodes of a Ray cluster (ray; "
    "docs/ray.md). Default: ray when the sweep file has a `ray` section, else local.",
)
@click.option(
    "--ray-address",
    metavar="HOST:PORT|auto",
    help="With --backend ray: the cluster to join (default: the file's, else a new local instance).",
)
@click.option(
    "--ray-placement",
    type=click.Choice(["same-node", "cross-node"]),
    help="With --backend ray: prefill and decode on one node, or each server on its own node.",
)
@click.option("--baseline-url", help="Attach mode: your running no-PD baseline server.")
@click.option("--pd-url", help="Attach mode: your running PD endpoint (proxy or router).")
@click.option(
    "--decoder-metrics-url",
    multiple=True,
    help="Attach mode: a decoder's /metrics (repeatable), scraped for KV evidence.",
)
@list_option
def sweep(
    file,
    out,
    resume,
    shard,
    only,
    keyword,
    dry_run,
    check_argv,
    gpus,
    early_stop,
    continue_on_error,
    backend,
    ray_address,
    ray_placement,
    baseline_url,
    pd_url,
    decoder_metrics_url,
    list_shipped,
) -> None:
    if list_shipped:
        console.print(shipped_sweeps_table())
        return
    from pdcheck.serving.endpoints import AttachNames, attach_options
    from pdcheck.sweep.backends import BackendChoice, ray_settings
    from pdcheck.sweep.engine import SweepOptions
    from pdcheck.sweep.run import (
        SweepRequest,
        default_sweep_file,
        parse_shard,
        prepare,
        run_sweep,
    )

    attach = attach_options(
        baseline_url=baseline_url,
        pd_url=pd_url,
        decoder_metrics_urls=decoder_metrics_url,
        names=AttachNames("--baseline-url", "--pd-url", "--decoder-metrics-url"),
    )
    if gpus is not None and not dry_run:
        raise ConfigError(
            "--gpus plans a dry run for that many GPUs; add --dry-run (a real run uses the GPUs it finds)"
        )
    if file is None and resume is None:
        from pdcheck.serving.gpus import read_inventory

        gpus = read_inventory().count
        file = default_sweep_file(has_gpus=gpus > 0)
        err_console.print(
            f"No sweep file given: using the shipped sweep {file} ({gpus} GPU(s) found)."
        )
    request = SweepRequest(
        file=file,
        out=out,
        resume=resume,
        shard=parse_shard(shard) if shard else None,
        only=only,
        keyword=keyword,
        attach=attach,
        options=SweepOptions(continue_on_error=continue_on_error, early_stop=early_stop),
        backend=BackendChoice(backend, ray_address, ray_placement),
    )
    if dry_run:
        from pdcheck.sweep.dryrun import dry_run as plan_dry_run

        prepared = prepare(request)
        planned = plan_dry_run(
            prepared,
            check_argv=check_argv,
            gpus=gpus,
            ray=ray_settings(prepared.spec.ray, request.backend),
        )
        console.print(planned.text, markup=False, highlight=False, soft_wrap=True)
        raise click.exceptions.Exit(int(ExitCode.CONFIG if planned.problems else ExitCode.OK))
    with LiveDisplay() as display:
        result = run_sweep(request, on_event=display.update)
    from pdcheck.results.load import load_run

    print_summary(load_run(result.root))
    raise click.exceptions.Exit(int(result.exit_code))


@click.command(
    help="Join sharded result folders (from `pdcheck sweep --shard i/n`) into one.\n"
    + EXIT_CODES_HELP
)
@click.argument(
    "dirs", nargs=-1, required=True, type=click.Path(exists=True, file_okay=False, path_type=Path)
)
@click.option(
    "--out", required=True, type=click.Path(path_type=Path), help="The merged folder (new)."
)
def merge(dirs, out) -> None:
    from pdcheck.sweep.merge import merge_runs

    raise click.exceptions.Exit(print_summary(merge_runs(list(dirs), out)))


class LiveDisplay:
    """Cells done/total, current cell and phase, questions/s, ETA and verdicts so far, live."""

    def __init__(self):
        self._live = Live(Table(), console=console, refresh_per_second=4, transient=True)

    def __enter__(self) -> LiveDisplay:
        self._live.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self._live.__exit__(*exc)

    def update(self, event) -> None:
        if event.kind in ("weights", "planned", "unit-done", "verdict", "failure", "race"):
            # A verdict's whole reason is in the summary's file and the report: one line here.
            one_line = event.kind == "verdict"
            console.print(
                Text.assemble((f"{event.elapsed_s:7.0f}s ", "dim"), event.message),
                no_wrap=one_line,
                overflow="ellipsis" if one_line else "fold",
            )
        if event.kind == "record" and event.questions_done % 10:
            return  # redraw every 10 questions, not every one
        table = Table.grid(padding=(0, 2))
        eta = "?" if event.eta_s is None else f"{event.eta_s / 60:.1f} min"
        verdicts = ", ".join(f"{k} {v}" for k, v in sorted(event.verdicts.items())) or "none yet"
        table.add_row(
            "cells",
            f"{event.cells_done}/{event.cells_total}",
            "server starts",
            str(event.server_starts),
        )
        table.add_row("now", f"{event.current_cell or '-'}: {event.phase or '-'}", "", "")
        table.add_row(
            "questions",
            f"{event.questions_done}/{event.questions_total} ({event.questions_per_s:.1f} q/s)",
            "ETA",
            eta,
        )
        table.add_row("verdicts", verdicts, "", "")
        self._live.update(table)


def print_summary(run: RunResults) -> int:
    """One line per cell and concurrency, then where the results are; returns the run's exit code."""
    from pdcheck.report.terminal import render_summary
    from pdcheck.results.summary import run_summary

    summary = run_summary(run)
    console.print(render_summary(run))
    if summary.race is not None:
        console.print(
            f"race harness: {summary.race.status} ({summary.race.reason})",
            markup=False,
            highlight=False,
        )
    console.print(
        f"results: {run.info.root}  exit code {summary.exit_code}", markup=False, highlight=False
    )
    return summary.exit_code
