"""Small pieces shared by command modules: the rich consoles (stdout for results, stderr for
progress), and the one dialect every command speaks for JSON output and deprecated spellings."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import click
from rich.console import Console

console = Console()
err_console = Console(stderr=True)

F = TypeVar("F", bound=Callable[..., Any])

# What `--json` alone stands for; any other value is the deprecated `--json FILE`.
_TO_STDOUT = "-"


def deprecated(old: str, new: str) -> None:
    """One line on stderr: the old spelling still works for this release."""
    click.echo(f"pdcheck: {old} is deprecated and goes in the next release; use {new}", err=True)


def json_options(what: str) -> Callable[[F], F]:
    """`--json` (print `what` as JSON on stdout instead of the table) and `--out FILE` (also
    write it to FILE), as every command that has a JSON form spells them. The old `--json FILE`
    still writes FILE, with a deprecation line; resolve the pair with `json_destinations`."""

    def decorate(command: F) -> F:
        command = click.option(
            "--out",
            "out_path",
            type=click.Path(dir_okay=False),
            help=f"Also write {what} as JSON to this file.",
        )(command)
        return click.option(
            "--json",
            "json_arg",
            is_flag=False,
            flag_value=_TO_STDOUT,
            default=None,
            metavar="",
            help=f"Print {what} as JSON on stdout instead of the table.",
        )(command)

    return decorate


def json_destinations(json_arg: str | None, out_path: str | None) -> tuple[bool, str | None]:
    """(print JSON on stdout, the file to write it to) from `--json` and `--out`."""
    if json_arg is None or json_arg == _TO_STDOUT:
        return json_arg == _TO_STDOUT, out_path
    deprecated("--json FILE", "--out FILE")
    if out_path is not None:
        raise click.UsageError(
            "give the file once, as --out FILE (--json FILE is its old spelling)"
        )
    return False, json_arg
