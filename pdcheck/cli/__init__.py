"""The `pdcheck` command line: a click group whose commands load lazily from sibling modules.

\b
Exit codes (every command):
  0  pass: all cells PASS and every canary was flagged; harness clean;
     bisect found the first bad commit
  1  REGRESSION or SUSPECT, a canary that was not flagged, race findings;
     bisect was left with only skipped commits
  2  infra error: servers crashed, no KV transferred, the harness could not run;
     bisect ended without naming a commit
  3  bad input (sweep file, options, a malformed file to read); nothing was started
A bisect step (python -m pdcheck.bisect.step) exits as `git bisect run` expects:
0 good, 1 bad, 125 skip.
"""

from __future__ import annotations

import importlib
import sys

import click

from pdcheck import __version__
from pdcheck.errors import ExitCode, PdcheckError

# name -> (module:attribute, one-line help). The help is here so `--help` imports nothing heavy.
COMMANDS: dict[str, tuple[str, str]] = {
    "sweep": (
        "pdcheck.cli.sweep:sweep",
        "Run a sweep: PD against its no-PD baseline, cell by cell, with verdicts.",
    ),
    "validate": (
        "pdcheck.cli.validate:validate",
        "Check a sweep file and print its cells; starts nothing.",
    ),
    "up": (
        "pdcheck.cli.serve:up",
        "Start a baseline and PD topology for a cell and keep it up until Ctrl-C.",
    ),
    "proxy": (
        "pdcheck.cli.serve:proxy",
        "Run the PD proxy in front of given prefill and decode servers.",
    ),
    "eval": (
        "pdcheck.cli.eval:eval_cmd",
        "Run GSM8K against one OpenAI-compatible URL and save per-question records.",
    ),
    "compare": (
        "pdcheck.cli.compare:compare",
        "Compare two record files question by question (baseline vs PD).",
    ),
    "report": ("pdcheck.cli.report:report", "Render a results folder as markdown, JSON or JUnit."),
    "merge": ("pdcheck.cli.sweep:merge", "Join sharded result folders into one."),
    "race": (
        "pdcheck.cli.race:race",
        "Drive vLLM's real scheduler in-process and check for KV races.",
    ),
    "trace": (
        "pdcheck.cli.race:trace",
        "Check scheduler traces recorded by pdcheck's vLLM plugin.",
    ),
    "bisect": (
        "pdcheck.cli.bisect:bisect",
        "Find the vLLM commit that brought a PD race or regression back.",
    ),
    "doctor": (
        "pdcheck.cli.doctor:doctor",
        "Report the environment: python, vLLM, nixl, GPUs, memory, race fixes.",
    ),
    "fixtures": (
        "pdcheck.cli.fixtures:fixtures",
        "Build the tiny models and data used for CPU runs.",
    ),
}


class LazyGroup(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return list(COMMANDS)

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        if name not in COMMANDS:
            return None
        target, _ = COMMANDS[name]
        module, attr = target.split(":")
        return getattr(importlib.import_module(module), attr)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        with formatter.section("Commands"):
            formatter.write_dl([(name, help_) for name, (_, help_) in COMMANDS.items()])


@click.group(cls=LazyGroup, help=__doc__.split("\n", 1)[1] if __doc__ else None)
@click.version_option(__version__, prog_name="pdcheck")
@click.option("-v", "--verbose", count=True, help="More logging (-v info, -vv debug).")
def cli(verbose: int) -> None:
    import logging

    level = logging.WARNING - 10 * min(verbose, 2)
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")


def main(argv: list[str] | None = None) -> int:
    """Entry point: runs the group and maps errors to pdcheck's exit codes."""
    try:
        rv = cli.main(args=argv, prog_name="pdcheck", standalone_mode=False)
    except click.exceptions.Exit as exc:
        return exc.exit_code
    except click.exceptions.Abort:
        click.echo("Aborted.", err=True)
        return 130
    except click.UsageError as exc:
        # click would exit 2 here, which pdcheck reserves for infra errors.
        exc.show()
        return int(ExitCode.CONFIG)
    except click.ClickException as exc:
        exc.show()
        return int(ExitCode.CONFIG)
    except PdcheckError as exc:
        click.echo(f"{type(exc).__name__}: {exc}", err=True)
        return int(exc.exit_code)
    return int(rv or 0)


def run() -> None:  # pragma: no cover - console script shim
    sys.exit(main())
