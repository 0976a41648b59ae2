"""Join shard folders into one run folder (`pdcheck merge`).

Each shard ran a disjoint set of cells (`--shard i/n` splits by cell id), so merging copies
cell folders side by side. A cell found in two shards is refused rather than picked: the
shards then came from different sweeps or a shard was run twice.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable, Sequence
from pathlib import Path

from pdcheck.errors import ConfigError
from pdcheck.sweep.junit import render_junit
from pdcheck.sweep.store import (
    Provenance,
    RunResults,
    RunStore,
    load_run,
    read_json,
    write_json_atomic,
)
from pdcheck.sweep.summary import summarize


def merge_runs(
    sources: Sequence[Path], out: Path, *, render_report: Callable[[RunResults], str] | None = None
) -> RunResults:
    """Copy every shard's cells (and the race summary) into `out`, then write junit, report and summary."""
    if out.exists() and any(out.iterdir()):
        raise ConfigError(f"--out {out} already holds files; merge into a new folder")
    runs = []
    for src in sources:
        run = read_json(Path(src) / "run.json")
        if run is None:
            raise ConfigError(f"{src} is not a pdcheck run folder (no run.json)")
        runs.append(run)
    shas = {r["sweep"].get("sha256") for r in runs}
    if len(shas) > 1:
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
    merged = dict(
        first,
        finished=max((r.get("finished") or "" for r in runs), default=None) or None,
        shard=None,
        started=min(r.get("started") or "" for r in runs),
        merged_from=[str(s) for s in sources],
        shards=[r.get("shard") for r in runs],
    )
    merged["sweep"] = dict(first["sweep"], cells=sorted(owner), selection=None)
    write_json_atomic(out / "run.json", merged)
    store = RunStore(out, Provenance.from_stamp(first))
    results = load_run(out)
    store.write_junit(render_junit(results))
    if render_report is not None:
        store.write_report(render_report(results))
    store.finish(summarize(results))
    return load_run(out)
