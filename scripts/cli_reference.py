"""Rewrite the README's CLI reference from the click commands, so that it cannot drift.

    python scripts/cli_reference.py

Every command of `pdcheck` (and each subcommand of a group) gets its usage line, the first
paragraph of its help, and one table row per option, as `--help` prints them (an option's
names, its value, its help and default). Hidden options (deprecated spellings) and `--help`
are left out.
The block goes between the README's markers; `tests/unit/test_cli_reference.py` checks that
the README's block is exactly what this script renders.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Iterator
from pathlib import Path

import click

from pdcheck.cli import cli

REPO = Path(__file__).resolve().parent.parent
README = REPO / "README.md"
BEGIN = "<!-- cli-reference: begin; written by scripts/cli_reference.py from the click commands, do not edit -->"
END = "<!-- cli-reference: end -->"


def commands() -> Iterator[tuple[click.Context, click.Command]]:
    """`pdcheck` itself (its global options), then each command in `pdcheck --help`'s order and
    its subcommands, with its context."""

    def walk(
        command: click.Command, ctx: click.Context
    ) -> Iterator[tuple[click.Context, click.Command]]:
        if isinstance(command, click.Group):
            for name in command.list_commands(ctx):
                sub = command.get_command(ctx, name)
                assert sub is not None, name
                yield from walk(sub, click.Context(sub, info_name=name, parent=ctx))
        else:
            yield ctx, command

    root = click.Context(cli, info_name="pdcheck")
    yield root, cli
    yield from walk(cli, root)


def _cell(text: str, *, code: bool = False) -> str:
    """One table cell: on one line, its pipes escaped, and outside code its `<x>` kept as text."""
    text = " ".join(text.split()).replace("|", "\\|")
    return f"`{text}`" if code else text.replace("<", "&lt;").replace(">", "&gt;")


def _section(ctx: click.Context, command: click.Command) -> str:
    usage = " ".join([ctx.command_path, *command.collect_usage_pieces(ctx)])
    # The help's first paragraph; `\b` marks a paragraph click must not rewrap.
    summary = (command.help or "").replace("\b", "").strip().split("\n\n")[0]
    # Arguments are in the usage line; --help is on every command.
    rows = [
        f"| {_cell(names, code=True)} | {_cell(help_)} |"
        for param in command.get_params(ctx)
        if isinstance(param, click.Option) and "--help" not in param.opts
        if (record := param.get_help_record(ctx)) is not None
        for names, help_ in [record]
    ]
    return "\n".join(
        [
            f"### `{ctx.command_path}`",
            "",
            f"`{usage}`",
            "",
            _cell(summary),
            "",
            "| option | what it does |",
            "|---|---|",
            *rows,
        ]
    )


def render_block() -> str:
    """The README's CLI reference block, markers included."""
    return "\n\n".join([BEGIN, *(_section(ctx, command) for ctx, command in commands()), END])


def readme_block(text: str) -> str:
    """The README's CLI reference block, markers included; SystemExit unless there is exactly one."""
    found = re.findall(rf"^{re.escape(BEGIN)}$.*?^{re.escape(END)}$", text, flags=re.M | re.S)
    if len(found) != 1 or text.count(BEGIN) != 1 or text.count(END) != 1:
        raise SystemExit(f"README.md must hold one `{BEGIN}` ... `{END}` block")
    return found[0]


def main() -> int:
    text = README.read_text()
    README.write_text(text.replace(readme_block(text), render_block()))
    print("README.md: CLI reference rendered from the click commands")
    return 0


if __name__ == "__main__":
    sys.exit(main())
