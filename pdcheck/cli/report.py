"""`pdcheck report`: render a results folder as markdown, JSON or JUnit."""

from __future__ import annotations

from pathlib import Path

import click

from pdcheck.cli._common import err_console
from pdcheck.errors import ConfigError, ExitCode

FORMATS = ("md", "json", "junit")


def _load(path: Path):
    from pdcheck.results.load import load_run

    try:
        return load_run(path)
    except FileNotFoundError as exc:
        raise ConfigError(
            f"{exc}; give the folder `pdcheck sweep` wrote (it holds run.json)"
        ) from None


@click.command(name="report")
@click.argument("results_dir", type=click.Path(file_okay=False, path_type=Path))
@click.option(
    "--format",
    "fmt",
    type=click.Choice(FORMATS),
    default="md",
    show_default=True,
    help="md: the PR report; json: every result with its numbers; junit: one testcase per cell and concurrency.",
)
@click.option(
    "--against",
    "against_dir",
    type=click.Path(file_okay=False, path_type=Path),
    help="An older results folder (e.g. main's): results whose verdict or accuracy changed come first.",
)
@click.option(
    "--out", type=click.Path(dir_okay=False, path_type=Path), help="Write here instead of stdout."
)
@click.option(
    "--max-chars",
    type=click.IntRange(min=1000),
    default=65536,
    show_default=True,
    help="Markdown only: shed detail (never a verdict) to fit; 65536 is GitHub's comment limit.",
)
def report(
    results_dir: Path, fmt: str, against_dir: Path | None, out: Path | None, max_chars: int
) -> None:
    """Render RESULTS_DIR (a `pdcheck sweep` results folder) as a report.

    Exits with the run's own code: 0 all pass, 1 a REGRESSION/SUSPECT or an unflagged canary,
    2 infra errors only, 3 when RESULTS_DIR is not a results folder.
    """
    from pdcheck.report import render_json, render_junit, render_markdown
    from pdcheck.results.summary import run_summary

    run = _load(results_dir)
    against = _load(against_dir) if against_dir is not None else None
    if fmt == "md":
        text = render_markdown(run, against=against, max_chars=max_chars)
    elif fmt == "json":
        text = render_json(run, against=against)
    else:
        text = render_junit(run)
    if out is None:
        click.echo(text, nl=False)
    else:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text, encoding="utf-8")
        err_console.print(f"wrote {out} ({len(text):,} characters)")
    raise click.exceptions.Exit(int(ExitCode(run_summary(run).exit_code)))
