"""`pdcheck fixtures`: build the tiny models (random and trained) used for CPU runs."""

from __future__ import annotations

from pathlib import Path

import click
from rich.table import Table

from pdcheck.cli._common import console


@click.group(name="fixtures")
def fixtures() -> None:
    """Build the tiny models and data used for CPU runs."""


@fixtures.command("tiny-models")
@click.option("--out", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Folder to build into (default: $PDCHECK_CACHE_DIR/models, else ~/.cache/pdcheck/models).")
@click.option("--force", is_flag=True, help="Rebuild even the models that already match fixtures/manifest.json.")
@click.option("--write-manifest", is_flag=True,
              help="Maintainers: record the built files' sha256 in fixtures/manifest.json (after changing a recipe).")
def tiny_models(out: Path | None, force: bool, write_manifest: bool) -> None:
    """Build random-weight tiny models and install the trained ones; fast when already built."""
    from pdcheck.fixtures.build import current_digests, ensure_tiny_models
    from pdcheck.fixtures.manifest import load_manifest, write_manifest as save_manifest

    results = ensure_tiny_models(out, force=force)
    if write_manifest:
        entries = load_manifest()
        entries.update(current_digests(results[0].path.parent, [r.name for r in results]))
        save_manifest(entries)
    table = Table("model", "action", "manifest", "path")
    for r in results:
        status = "[green]match[/]" if r.matches_manifest or write_manifest else f"[yellow]{'; '.join(r.problems)}[/]"
        table.add_row(r.name, r.action, status, str(r.path))
    console.print(table)
