"""Small pieces shared by command modules: the rich console and the not-built-yet stub."""

from __future__ import annotations

import click
from rich.console import Console

from pdcheck.errors import ExitCode

console = Console()
err_console = Console(stderr=True)


def not_built(name: str, issue: str) -> click.Command:
    """A placeholder command that says it is not built yet and exits 2; it never pretends to work."""

    @click.command(name=name, context_settings={"ignore_unknown_options": True})
    @click.argument("args", nargs=-1, type=click.UNPROCESSED)
    def command(args: tuple[str, ...]) -> None:
        err_console.print(f"pdcheck {name} is not built yet ({issue}).")
        raise click.exceptions.Exit(int(ExitCode.INFRA))

    command.help = f"Not built yet ({issue})."
    return command
