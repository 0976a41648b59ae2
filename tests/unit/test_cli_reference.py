"""The README's CLI reference is what `scripts/cli_reference.py` renders from the click commands."""

from __future__ import annotations

from pathlib import Path

import click
import pytest

from tests.unit.scripts import load_script

REPO = Path(__file__).resolve().parents[2]


cli_reference = load_script("cli_reference")
# Loaded at collection: importing every command (the analysis's scipy among them) is not the test.
COMMANDS = list(cli_reference.commands())


def test_the_readme_reference_is_what_click_gives():
    """An option added, renamed or re-worded without running the script fails here."""
    block = cli_reference.readme_block((REPO / "README.md").read_text())
    assert block == cli_reference.render_block(), (
        "README.md's CLI reference is stale: run `python scripts/cli_reference.py`"
    )


def test_every_visible_option_of_every_command_is_in_the_reference():
    """The renderer itself leaves nothing out: each command has a section, each option a row."""
    block = cli_reference.render_block()
    paths = [ctx.command_path for ctx, _ in COMMANDS]
    assert {
        "pdcheck",
        "pdcheck sweep",
        "pdcheck trace check",
        "pdcheck fixtures tiny-models",
    } <= set(paths)
    for ctx, command in COMMANDS:
        section = block.split(f"### `{ctx.command_path}`\n", 1)[1].split("\n### ", 1)[0]
        for param in command.get_params(ctx):
            if isinstance(param, click.Option) and "--help" not in param.opts:
                # A hidden option (a deprecated spelling) is left out; every other one is a row.
                shown = f"| `{param.opts[0]}" in section
                assert shown != param.hidden, (ctx.command_path, param.opts)


def test_a_readme_without_the_markers_is_refused():
    with pytest.raises(SystemExit, match="must hold one"):
        cli_reference.readme_block("# no reference here\n")
