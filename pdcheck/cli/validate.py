"""`pdcheck validate FILE`: load a sweep, expand it, print its cells. Starts nothing."""

from __future__ import annotations

import click
from rich.table import Table

from pdcheck.cli._common import console
from pdcheck.config import expand_cells, level_expectation, load_sweep


def expected_levels(cell) -> str:
    """The concurrency levels where the cell is expected to be flagged, and those that must PASS."""
    flags = {c: level_expectation(cell, c).flag for c in cell.concurrency}
    groups = [
        (word, [str(c) for c, f in flags.items() if f == want])
        for word, want in (("flag", True), ("PASS", False))
    ]
    return "; ".join(f"{word} c{','.join(levels)}" for word, levels in groups if levels)


def cells_table(cells, title: str) -> Table:
    table = Table(title=title)
    for col in ("id", "name", "model", "P", "D", "async", "arm", "concurrency", "expected", "GPUs"):
        table.add_column(col)
    for c in cells:
        table.add_row(
            c.id,
            c.name,
            c.model.name,
            f"{c.prefill_instances}x TP{c.prefill_tp}",
            f"{c.decode_instances}x TP{c.decode_tp}",
            "on" if c.async_scheduling else "off",
            c.arm.name + (" (canary)" if c.arm.canary else ""),
            ",".join(map(str, c.concurrency)),
            expected_levels(c),
            str(c.gpus_needed),
        )
    return table


def shipped_sweeps_table() -> Table:
    """The sweeps installed with pdcheck: bare name, one-line description, expected GPU-hours."""
    from pdcheck.config.load import SWEEPS_DIR, shipped_sweep_names

    table = Table("name", "description", "GPU-hours", title=f"shipped sweeps ({SWEEPS_DIR})")
    for name in shipped_sweep_names():
        spec = load_sweep(name)
        hours = "?" if spec.expected_gpu_hours is None else f"{spec.expected_gpu_hours:g}"
        table.add_row(name, spec.description, hours)
    return table


list_option = click.option(
    "--list",
    "list_shipped",
    is_flag=True,
    help="List the shipped sweeps (name, description, expected GPU-hours) and exit.",
)


@click.command()
@click.argument("sweep_file", required=False)
@list_option
def validate(sweep_file: str | None, list_shipped: bool) -> None:
    """Check SWEEP_FILE (a path or a shipped sweep's name) and print its resolved cells."""
    if list_shipped:
        console.print(shipped_sweeps_table())
        return
    if sweep_file is None:
        raise click.UsageError("give a sweep file or a shipped sweep's name (see --list)")
    spec = load_sweep(sweep_file)
    cells = expand_cells(spec)
    console.print(cells_table(cells, f"{spec.name}: {len(cells)} cells"))
    reasons = {
        (c.arm.name, why)
        for c in cells
        if c.arm.canary
        for why in {level_expectation(c, level).why for level in c.concurrency}
    }
    if reasons:
        console.print("Why canary levels are expected to flag, or run as controls that must PASS:")
        for arm, why in sorted(reasons):
            console.print(f"  {arm}: {why}", highlight=False)
    from pdcheck.sweep.judging import clean_tests, sizing_lines

    for line in sizing_lines(cells, family_size=clean_tests(cells)):
        console.print(line, highlight=False)
