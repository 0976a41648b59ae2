"""Join shard folders into one run folder (`pdcheck merge`).

Each shard ran a disjoint set of cells (`--shard i/n` splits by cell id), so merging copies
cell folders side by side. A cell found in two shards is refused rather than picked: the
shards then came from different sweeps or a shard was run twice.
"""

from __future__ import annotations

import shutil
from collections.abc import Sequence
from pathlib import Path

import msgspec

from pdcheck.errors import ConfigError
from pdcheck.results.load import check_run, read_run_file
from pdcheck.results.schema import RunFile
from pdcheck.results.store import RunResults, create_run
from pdcheck.sweep.finish import finish_run


def merge_runs(sources: Sequence[Path], out: Path) -> RunResults:
    """Copy every shard's cells (and the race summary) into `out`, then write junit, report and summary."""
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ConfigError(
            f"--out {out} already exists and is not an empty folder; merge into a new folder"
        )
    runs: list[RunFile] = []
    for src in sources:
        if read_run_file(Path(src)) is None:
            raise ConfigError(f"{src} is not a pdcheck run folder (no run.json)")
        # Every file read now: a broken shard stops the merge before `out` is written.
        runs.append(check_run(Path(src)).info.file)
    if len({r.sweep.sha256 for r in runs}) > 1:
        raise ConfigError(
            "the folders come from different sweep files (sha256 differs); merge shards of one sweep"
        )
    owner: dict[str, Path] = {}
    for src in sources:
        for cell in sorted((Path(src) / "cells").glob("*--*")):
            if cell.name in owner:
                raise ConfigError(
                    f"cell {cell.name} is in both {owner[cell.name]} and {src}; each cell must come from one shard"
                )
            owner[cell.name] = Path(src)
    out.mkdir(parents=True, exist_ok=True)
    for name, src in owner.items():
        shutil.copytree(src / "cells" / name, out / "cells" / name)
    for src in sources:
        race = Path(src) / "race"
        if race.is_dir() and not (out / "race").exists():
            shutil.copytree(race, out / "race")
    first = runs[0]
    store = create_run(
        out,
        provenance=first.provenance,
        sweep=msgspec.structs.replace(first.sweep, cells=tuple(sorted(owner)), selection=None),
        environment=first.environment,
        started=min(r.started for r in runs),
        merged_from=[str(s) for s in sources],
        shards=[r.shard for r in runs],
    )
    return finish_run(store)
