"""The results store: the only writer under a run folder, and its reader `load_run`.

Layout (every JSON is a `pdcheck.results.schema` struct carrying `schema_version` and the
provenance stamp: pdcheck version, vLLM version/commit, dataset sha)::

    <run>/run.json                                  sweep, environment, started/finished, shard
    <run>/cells/<name>--<id>/cell.json              resolved cell, baseline key, servers that ran
    <run>/cells/<name>--<id>/<side>/c<N>/r<k>/records.jsonl   appended by evals as questions finish
    <run>/cells/<name>--<id>/<side>/c<N>/r<k>/summary.json    written last: the unit is done
    <run>/cells/<name>--<id>/<side>/c<N>/r<k>/failure.json    the unit failed (sidecar)
    <run>/cells/<name>--<id>/kv/c<N>-r<k>.json      KV-transfer metrics of one PD unit
    <run>/cells/<name>--<id>/verdicts/c<N>.json     CellVerdict, its outcome, the PairedComparison
    <run>/cells/<name>--<id>/logs/                  server logs
    <run>/race/summary.json, <run>/summary.json, <run>/junit.xml, <run>/report.md

Why this shape: a crash loses at most the record being written (records are appended and
fsynced), and a unit counts as done only once its `summary.json` exists, so resume can skip
done units and re-enter a half-done one where its records stop. Every JSON is written to a
temporary file and renamed, so a reader never sees half a file.
"""

from __future__ import annotations

import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import msgspec

from pdcheck.analysis.exact import ExactCheck
from pdcheck.analysis.injection import InjectionPrecision
from pdcheck.analysis.paired import PairedComparison
from pdcheck.analysis.sequential import EarlyStop
from pdcheck.analysis.verdict import CellVerdict, Outcome
from pdcheck.config.cells import SIDES, Side
from pdcheck.config.paths import write_text_atomic
from pdcheck.evals.summary import EvalSummary
from pdcheck.results._files import (
    failure_file,
    now_iso,
    read_file,
    trim_torn_tail,
    unit_rel,
    write_file,
)
from pdcheck.results.load import (
    CellResult,
    RunInfo,
    RunResults,
    UnitResult,
    donors,
    load_cell,
    load_run,
    read_cell_file,
    read_run_file,
)
from pdcheck.results.schema import (
    CELL_LOGS_DIR,
    STORE_SCHEMA_VERSION,
    CellFile,
    FailureFile,
    KvEvidence,
    KvFile,
    Provenance,
    RaceFile,
    RaceOutcome,
    RunFile,
    RunSummary,
    SweepInfo,
    UnitFile,
    VerdictFile,
    stamp,
)

if TYPE_CHECKING:
    from pdcheck.contracts.server_records import TopologyRecord

__all__ = [
    "SIDES",
    "STORE_SCHEMA_VERSION",
    "CellResult",
    "CellStore",
    "Provenance",
    "RunInfo",
    "RunResults",
    "RunStore",
    "Side",
    "SweepInfo",
    "UnitResult",
    "create_run",
    "donors",
    "load_cell",
    "load_run",
    "open_run",
]


class CellStore:
    """Writes one cell's folder. Obtained from `RunStore.cell(...)`."""

    def __init__(self, root: Path, dirname: str, provenance: Provenance):
        self.dir = root / "cells" / dirname
        self.dirname = dirname
        self.provenance = provenance

    @property
    def logs_dir(self) -> Path:
        path = self.dir / CELL_LOGS_DIR
        path.mkdir(parents=True, exist_ok=True)
        return path

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
        previous = read_cell_file(self.dir)
        write_file(
            self.dir / "cell.json",
            CellFile(
                **stamp(self.provenance),
                name=name,
                id=cell_id,
                dirname=self.dirname,
                resolved=resolved,
                baseline_key=baseline_key,
                servers=previous.servers if previous is not None else (),
                canary=canary,
            ),
        )

    def record_started(self, started: TopologyRecord) -> None:
        """Add the servers a job of this cell ran (argv, env, ports, devices, pids) to cell.json.

        Callers serialise calls for one cell (a cell's baseline and PD jobs may run at once).
        """
        meta = read_cell_file(self.dir)
        if meta is None:
            raise FileNotFoundError(
                f"{self.dir / 'cell.json'}: servers started before the cell was recorded"
            )
        write_file(
            self.dir / "cell.json", msgspec.structs.replace(meta, servers=(*meta.servers, started))
        )

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
        summary: EvalSummary,
        *,
        reused_from: str | None = None,
        early_stop: EarlyStop | None = None,
    ) -> None:
        """Marks the unit done; clears a failure sidecar left by an earlier attempt."""
        unit = self.unit_dir(side, concurrency, repeat)
        write_file(
            unit / "summary.json",
            UnitFile(
                **stamp(self.provenance),
                side=side,
                concurrency=concurrency,
                repeat=repeat,
                summary=summary,
                reused_from=reused_from,
                early_stop=early_stop,
            ),
        )
        (unit / "failure.json").unlink(missing_ok=True)

    def write_unit_failure(
        self, side: Side, concurrency: int, repeat: int, exc: BaseException
    ) -> None:
        where = unit_rel(side, concurrency, repeat)
        write_file(
            self.unit_dir(side, concurrency, repeat) / "failure.json",
            failure_file(exc, cell=self.dirname, where=where, provenance=self.provenance),
        )

    def copy_unit_failure(
        self, source: CellStore, side: Side, concurrency: int, repeat: int
    ) -> None:
        """A shared unit failed in the cell that ran it: the sharing cell gets the same sidecar."""
        rel = unit_rel(side, concurrency, repeat)
        failure = read_file(source.dir / rel / "failure.json", FailureFile)
        if failure is not None:
            write_file(self.unit_dir(side, concurrency, repeat) / "failure.json", failure)

    def copy_baseline_unit(self, source: CellStore, concurrency: int, repeat: int) -> None:
        """Reuse another cell's finished baseline unit (same `Cell.baseline_key()` and vLLM)."""
        src = source.dir / unit_rel("baseline", concurrency, repeat)
        unit = read_file(src / "summary.json", UnitFile)
        if unit is None:
            raise FileNotFoundError(f"baseline unit {src} has no summary.json; it is not done")
        dst = self.unit_dir("baseline", concurrency, repeat)
        shutil.copyfile(src / "records.jsonl", dst / "records.jsonl")
        self.write_unit_summary(
            "baseline",
            concurrency,
            repeat,
            unit.summary,
            reused_from=unit.reused_from or source.dirname,
        )

    def write_kv(self, concurrency: int, repeat: int, kv: KvEvidence) -> None:
        write_file(
            self.dir / "kv" / f"c{concurrency}-r{repeat}.json",
            KvFile(**stamp(self.provenance), concurrency=concurrency, repeat=repeat, kv=kv),
        )

    def write_verdict(
        self,
        concurrency: int,
        *,
        verdict: CellVerdict,
        outcome: Outcome,
        comparison: PairedComparison | None = None,
        injection: InjectionPrecision | None = None,
        carried_from: int | None = None,
        exact: ExactCheck | None = None,
    ) -> None:
        """`outcome` says what `verdict` means for the cell (canary logic); `injection` is the
        InjectionPrecision of an injected arm; `carried_from` the level an early stop carried;
        `exact` the bit-exact check of a cell in bit-exact mode."""
        write_file(
            self.dir / "verdicts" / f"c{concurrency}.json",
            VerdictFile(
                **stamp(self.provenance),
                concurrency=concurrency,
                verdict=verdict,
                outcome=outcome,
                comparison=comparison,
                injection=injection,
                carried_from=carried_from,
                exact=exact,
            ),
        )


class RunStore:
    """Writes one run folder; from `create_run` (start or resume a run) or `open_run`."""

    def __init__(self, root: Path, provenance: Provenance):
        self.root = Path(root)
        self.provenance = provenance

    def cell(self, dirname: str, provenance: Provenance | None = None) -> CellStore:
        return CellStore(self.root, dirname, provenance or self.provenance)

    def write_race_summary(self, race: RaceOutcome) -> None:
        # Tests hand a plain dict (msgspec converts it); that is pdcheck's own harness.
        write_file(
            self.race_folder(getattr(race, "environment", None)) / "summary.json",
            RaceFile(**stamp(self.provenance), race=race),
        )

    @property
    def race_dir(self) -> Path:
        path = self.root / "race"
        path.mkdir(parents=True, exist_ok=True)
        return path

    def race_folder(self, environment: str | None) -> Path:
        """race/ for the harness in pdcheck's python, race/<name>/ for an environment's."""
        path = self.race_dir / environment if environment else self.race_dir
        path.mkdir(parents=True, exist_ok=True)
        return path

    def write_junit(self, xml: str) -> None:
        write_text_atomic(self.root / "junit.xml", xml)

    def write_report(self, markdown: str) -> None:
        write_text_atomic(self.root / "report.md", markdown)

    def finish(self, summary: RunSummary) -> None:
        """Stamp run.json finished, then write summary.json, last of all."""
        run = read_run_file(self.root)
        if run is None:
            raise FileNotFoundError(f"{self.root} has no run.json; the run was never created")
        write_file(self.root / "run.json", msgspec.structs.replace(run, finished=now_iso()))
        write_file(self.root / "summary.json", summary)


def create_run(
    root: str | Path,
    *,
    provenance: Provenance,
    sweep: SweepInfo,
    environment: dict[str, Any],
    shard: tuple[int, int] | None = None,
    started: str | None = None,
    merged_from: Sequence[str] = (),
    shards: Sequence[tuple[int, int] | None] = (),
) -> RunStore:
    """Start a run folder (or resume one: its start time is kept and the resume time added).

    The only writer of run.json besides `RunStore.finish`. `merged_from`, `shards` and
    `started` are a merged run's (`pdcheck merge`).
    """
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    existing = read_run_file(root)
    run = RunFile(
        **stamp(provenance),
        sweep=sweep,
        environment=environment,
        started=existing.started if existing else (started or now_iso()),
        resumed=(*existing.resumed, now_iso()) if existing else (),
        finished=None,
        shard=shard,
        merged_from=tuple(merged_from),
        shards=tuple(shards),
    )
    write_file(root / "run.json", run)
    return RunStore(root, provenance)


def open_run(root: str | Path) -> RunStore | None:
    """The store of an existing run folder, with its provenance; None if it has no run.json."""
    run = read_run_file(Path(root))
    return RunStore(Path(root), run.provenance) if run is not None else None
