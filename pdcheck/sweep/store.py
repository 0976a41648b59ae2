"""The results store: the only writer under a run folder, and its reader `load_run`.

Layout (every JSON carries `schema_version` and the provenance stamp: pdcheck version,
vLLM version/commit, dataset sha)::

    <run>/run.json                                  sweep, environment, started/finished, shard
    <run>/cells/<name>--<id>/cell.json              resolved cell, baseline key, servers that ran
    <run>/cells/<name>--<id>/<side>/c<N>/r<k>/records.jsonl   appended by evals as questions finish
    <run>/cells/<name>--<id>/<side>/c<N>/r<k>/summary.json    written last: the unit is done
    <run>/cells/<name>--<id>/<side>/c<N>/r<k>/failure.json    the unit failed (sidecar)
    <run>/cells/<name>--<id>/kv/c<N>-r<k>.json      KV-transfer metrics of one PD unit
    <run>/cells/<name>--<id>/verdicts/c<N>.json     PairedComparison + CellVerdict dicts
    <run>/cells/<name>--<id>/failure.json           the cell failed before its units ran
    <run>/cells/<name>--<id>/logs/                  server logs
    <run>/race/summary.json, <run>/summary.json, <run>/junit.xml, <run>/report.md

Why this shape: a crash loses at most the record being written (records are appended and
fsynced), and a unit counts as done only once its `summary.json` exists, so resume can skip
done units and re-enter a half-done one where its records stop. Every JSON is written to a
temporary file and renamed, so a reader never sees half a file.
"""

from __future__ import annotations

import shutil
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pdcheck.sweep._files import (
    SIDES,
    STORE_SCHEMA_VERSION,
    Provenance,
    Side,
    failure_dict,
    now_iso,
    read_json,
    trim_torn_tail,
    unit_rel,
    write_json_atomic,
    write_text_atomic,
)
from pdcheck.sweep.results import (
    CellResult,
    Failure,
    RunInfo,
    RunResults,
    UnitResult,
    VerdictEntry,
    donors,
    load_cell,
    load_run,
)

if TYPE_CHECKING:
    from pdcheck.serving.endpoints import TopologyRecord

__all__ = [
    "SIDES",
    "STORE_SCHEMA_VERSION",
    "CellResult",
    "CellStore",
    "Failure",
    "Provenance",
    "RunInfo",
    "RunResults",
    "RunStore",
    "Side",
    "UnitResult",
    "VerdictEntry",
    "donors",
    "load_cell",
    "load_run",
    "read_json",
    "write_json_atomic",
]


class CellStore:
    """Writes one cell's folder. Obtained from `RunStore.cell(...)`."""

    def __init__(self, root: Path, dirname: str, provenance: Provenance):
        self.dir = root / "cells" / dirname
        self.dirname = dirname
        self.provenance = provenance

    @property
    def logs_dir(self) -> Path:
        path = self.dir / "logs"
        path.mkdir(parents=True, exist_ok=True)
        return path

    def _write(self, path: Path, payload: dict[str, Any]) -> None:
        write_json_atomic(path, self.provenance.stamp() | payload)

    def write_cell(
        self,
        *,
        resolved: dict[str, Any],
        name: str,
        cell_id: str,
        baseline_key: str,
        canary: bool,
    ) -> None:
        """cell.json; the servers recorded by an earlier run of this folder are kept."""
        previous = read_json(self.dir / "cell.json") or {}
        self._write(
            self.dir / "cell.json",
            {
                "name": name,
                "id": cell_id,
                "dirname": self.dirname,
                "resolved": resolved,
                "baseline_key": baseline_key,
                "servers": previous.get("servers", []),
                "canary": canary,
            },
        )

    def record_started(self, started: TopologyRecord) -> None:
        """Add the servers a job of this cell ran (argv, env, ports, devices, pids) to cell.json.

        Callers serialise calls for one cell (a cell's baseline and PD jobs may run at once).
        """
        meta = read_json(self.dir / "cell.json") or {}
        meta["servers"] = [*meta.get("servers", []), asdict(started)]
        write_json_atomic(self.dir / "cell.json", meta)

    def unit_dir(self, side: Side, concurrency: int, repeat: int) -> Path:
        path = self.dir / unit_rel(side, concurrency, repeat)
        path.mkdir(parents=True, exist_ok=True)
        return path

    def records_path(self, side: Side, concurrency: int, repeat: int) -> Path:
        """Where evals appends this unit's records (evals resumes from what is there).

        A line torn by a kill mid-write is cut off first: appending after it would glue the
        next record onto the fragment and make the file unreadable.
        """
        path = self.unit_dir(side, concurrency, repeat) / "records.jsonl"
        trim_torn_tail(path)
        return path

    def unit_done(self, side: Side, concurrency: int, repeat: int) -> bool:
        return (self.dir / unit_rel(side, concurrency, repeat) / "summary.json").is_file()

    def write_unit_summary(
        self,
        side: Side,
        concurrency: int,
        repeat: int,
        summary: dict[str, Any],
        *,
        reused_from: str | None = None,
    ) -> None:
        """Marks the unit done; clears a failure sidecar left by an earlier attempt."""
        unit = self.unit_dir(side, concurrency, repeat)
        self._write(
            unit / "summary.json",
            {
                "side": side,
                "concurrency": concurrency,
                "repeat": repeat,
                "summary": summary,
                "reused_from": reused_from,
            },
        )
        (unit / "failure.json").unlink(missing_ok=True)

    def write_unit_failure(
        self, side: Side, concurrency: int, repeat: int, exc: BaseException
    ) -> None:
        where = unit_rel(side, concurrency, repeat)
        self._write(
            self.unit_dir(side, concurrency, repeat) / "failure.json",
            failure_dict(exc, cell=self.dirname, where=where),
        )

    def copy_unit_failure(
        self, source: CellStore, side: Side, concurrency: int, repeat: int
    ) -> None:
        """A shared unit failed in the cell that ran it: the sharing cell gets the same sidecar."""
        data = read_json(source.dir / unit_rel(side, concurrency, repeat) / "failure.json")
        if data is not None:
            write_json_atomic(self.unit_dir(side, concurrency, repeat) / "failure.json", data)

    def copy_baseline_unit(self, source: CellStore, concurrency: int, repeat: int) -> None:
        """Reuse another cell's finished baseline unit (same `Cell.baseline_key()` and vLLM)."""
        src = source.dir / unit_rel("baseline", concurrency, repeat)
        data = read_json(src / "summary.json")
        if data is None:
            raise FileNotFoundError(f"baseline unit {src} has no summary.json; it is not done")
        dst = self.unit_dir("baseline", concurrency, repeat)
        shutil.copyfile(src / "records.jsonl", dst / "records.jsonl")
        self.write_unit_summary(
            "baseline",
            concurrency,
            repeat,
            data["summary"],
            reused_from=data.get("reused_from") or source.dirname,
        )

    def write_kv(self, concurrency: int, repeat: int, kv: dict[str, Any]) -> None:
        self._write(
            self.dir / "kv" / f"c{concurrency}-r{repeat}.json",
            {"concurrency": concurrency, "repeat": repeat, "kv": kv},
        )

    def verdict_done(self, concurrency: int) -> bool:
        return (self.dir / "verdicts" / f"c{concurrency}.json").is_file()

    def write_verdict(
        self,
        concurrency: int,
        *,
        comparison: dict[str, Any] | None,
        verdict: dict[str, Any],
        outcome: dict[str, Any],
        injection: dict[str, Any] | None = None,
    ) -> None:
        """`verdict` is a CellVerdict dict; `outcome` says what it means for the cell (canary logic);
        `injection` is the InjectionPrecision of an injected arm."""
        self._write(
            self.dir / "verdicts" / f"c{concurrency}.json",
            {
                "concurrency": concurrency,
                "comparison": comparison,
                "verdict": verdict,
                "outcome": outcome,
                "injection": injection,
            },
        )

    def write_failure(self, exc: BaseException, *, phase: str) -> None:
        self._write(self.dir / "failure.json", failure_dict(exc, cell=self.dirname, where=phase))

    def clear_failure(self) -> None:
        (self.dir / "failure.json").unlink(missing_ok=True)


class RunStore:
    """Writes one run folder. `create` starts a run; `open` continues one (resume, merge)."""

    def __init__(self, root: Path, provenance: Provenance):
        self.root = Path(root)
        self.provenance = provenance

    @classmethod
    def create(
        cls,
        root: str | Path,
        *,
        provenance: Provenance,
        sweep: dict[str, Any],
        environment: dict[str, Any],
        shard: tuple[int, int] | None = None,
    ) -> RunStore:
        store = cls(Path(root), provenance)
        store.root.mkdir(parents=True, exist_ok=True)
        existing = read_json(store.root / "run.json")
        body = {
            "sweep": sweep,
            "environment": environment,
            "started": existing["started"] if existing else now_iso(),
            "resumed": ([*existing.get("resumed", []), now_iso()]) if existing else [],
            "finished": None,
            "shard": list(shard) if shard else None,
        }
        write_json_atomic(store.root / "run.json", provenance.stamp() | body)
        return store

    def cell(self, dirname: str, provenance: Provenance | None = None) -> CellStore:
        return CellStore(self.root, dirname, provenance or self.provenance)

    def write_race_summary(self, summary: dict[str, Any]) -> None:
        write_json_atomic(
            self.root / "race" / "summary.json", self.provenance.stamp() | {"race": summary}
        )

    @property
    def race_dir(self) -> Path:
        path = self.root / "race"
        path.mkdir(parents=True, exist_ok=True)
        return path

    def write_junit(self, xml: str) -> None:
        write_text_atomic(self.root / "junit.xml", xml)

    def write_report(self, markdown: str) -> None:
        write_text_atomic(self.root / "report.md", markdown)

    def finish(self, summary: dict[str, Any]) -> None:
        """Stamp run.json finished, then write summary.json, last of all."""
        run = read_json(self.root / "run.json") or {}
        run["finished"] = now_iso()
        write_json_atomic(self.root / "run.json", run)
        write_json_atomic(self.root / "summary.json", self.provenance.stamp() | summary)
