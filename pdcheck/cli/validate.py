"""`pdcheck validate FILE`: load a sweep, expand it, print its cells. Starts nothing."""

from __future__ import annotations

import click
from rich.table import Table

from pdcheck.cli._common import console
from pdcheck.config import expand_cells, load_sweep


def cells_table(cells, title: str) -> Table:
    table = Table(title=title)
    for col in ("id", "name", "model", "P", "D", "async", "arm", "concurrency", "GPUs"):
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
            str(c.gpus_needed),
        )
    return table


@click.command()
@click.argument("sweep_file")
def validate(sweep_file: str) -> None:
    """Check SWEEP_FILE (a path or a shipped sweep's name) and print its resolved cells."""
    spec = load_sweep(sweep_file)
    cells = expand_cells(spec)
    console.print(cells_table(cells, f"{spec.name}: {len(cells)} cells"))
