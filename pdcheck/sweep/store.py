"""The results store: the only writer under a run folder, and its reader `load_run`.

Layout (every JSON carries `schema_version` and the provenance stamp: pdcheck version,
vLLM version/commit, dataset sha)::

    <run>/run.json                                  sweep, environment, started/finished, shard
    <run>/cells/<name>--<id>/cell.json              resolved cell, server commands, baseline key
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

import json
import os
import shutil
import tempfile
import traceback
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

from pdcheck import __version__
from pdcheck.evals.records import QuestionRecord, read_records

STORE_SCHEMA_VERSION = 1
SIDES = ("baseline", "pd")
Side = Literal["baseline", "pd"]


def now_iso() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


def write_json_atomic(path: Path, data: dict[str, Any]) -> None:
    """Write to a temporary file beside `path`, fsync, then rename over it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(data, f, indent=2, sort_keys=True, default=str)
            f.write("\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_text_atomic(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def trim_torn_tail(path: Path) -> None:
    """Truncate `path` after its last newline, if it ends in a partial line."""
    if not path.is_file():
        return
    data = path.read_bytes()
    if not data or data.endswith(b"\n"):
        return
    with open(path, "r+b") as f:
        f.truncate(data.rfind(b"\n") + 1)


def read_json(path: Path) -> dict[str, Any] | None:
    if not path.is_file():
        return None
    with open(path, encoding="utf-8") as f:
        return json.load(f)


@dataclass(frozen=True)
class Provenance:
    """Stamped into every JSON the store writes, so any file says what produced it."""

    pdcheck_version: str = __version__
    vllm_version: str | None = None
    vllm_commit: str | None = None
    dataset_sha256: str | None = None

    def stamp(self) -> dict[str, Any]:
        return {
            "schema_version": STORE_SCHEMA_VERSION,
            "pdcheck_version": self.pdcheck_version,
            "vllm_version": self.vllm_version,
            "vllm_commit": self.vllm_commit,
            "dataset_sha256": self.dataset_sha256,
        }

    @classmethod
    def from_stamp(cls, data: dict[str, Any]) -> Provenance:
        return cls(
            pdcheck_version=data.get("pdcheck_version") or "unknown",
            vllm_version=data.get("vllm_version"),
            vllm_commit=data.get("vllm_commit"),
            dataset_sha256=data.get("dataset_sha256"),
        )


def failure_dict(exc: BaseException, *, cell: str | None, where: str) -> dict[str, Any]:
    """The body of a failure.json sidecar: error type, message, cell, and where it happened."""
    return {
        "error_type": type(exc).__name__,
        "message": str(exc),
        "cell": cell,
        "where": where,
        "at": now_iso(),
        "traceback": "".join(traceback.format_exception(exc))[-4000:],
    }


def unit_rel(side: str, concurrency: int, repeat: int) -> str:
    return f"{side}/c{concurrency}/r{repeat}"


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

    def write_cell(self, *, resolved: dict[str, Any], name: str, cell_id: str,
                   baseline_key: str, servers: dict[str, Any], canary: bool) -> None:
        self._write(self.dir / "cell.json", {
            "name": name, "id": cell_id, "dirname": self.dirname, "resolved": resolved,
            "baseline_key": baseline_key, "servers": servers, "canary": canary,
        })

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

    def write_unit_summary(self, side: Side, concurrency: int, repeat: int, summary: dict[str, Any],
                           *, reused_from: str | None = None) -> None:
        """Marks the unit done; clears a failure sidecar left by an earlier attempt."""
        unit = self.unit_dir(side, concurrency, repeat)
        self._write(unit / "summary.json", {
            "side": side, "concurrency": concurrency, "repeat": repeat,
            "summary": summary, "reused_from": reused_from,
        })
        (unit / "failure.json").unlink(missing_ok=True)

    def write_unit_failure(self, side: Side, concurrency: int, repeat: int, exc: BaseException) -> None:
        where = unit_rel(side, concurrency, repeat)
        self._write(self.unit_dir(side, concurrency, repeat) / "failure.json",
                    failure_dict(exc, cell=self.dirname, where=where))

    def copy_baseline_unit(self, source: CellStore, concurrency: int, repeat: int) -> None:
        """Reuse another cell's finished baseline unit (same `Cell.baseline_key()` and vLLM)."""
        src = source.dir / unit_rel("baseline", concurrency, repeat)
        data = read_json(src / "summary.json")
        if data is None:
            raise FileNotFoundError(f"baseline unit {src} has no summary.json; it is not done")
        dst = self.unit_dir("baseline", concurrency, repeat)
        shutil.copyfile(src / "records.jsonl", dst / "records.jsonl")
        self.write_unit_summary("baseline", concurrency, repeat, data["summary"],
                                reused_from=data.get("reused_from") or source.dirname)

    def write_kv(self, concurrency: int, repeat: int, kv: dict[str, Any]) -> None:
        self._write(self.dir / "kv" / f"c{concurrency}-r{repeat}.json",
                    {"concurrency": concurrency, "repeat": repeat, "kv": kv})

    def verdict_done(self, concurrency: int) -> bool:
        return (self.dir / "verdicts" / f"c{concurrency}.json").is_file()

    def write_verdict(self, concurrency: int, *, comparison: dict[str, Any] | None, verdict: dict[str, Any],
                      outcome: dict[str, Any], injection: dict[str, Any] | None = None) -> None:
        """`verdict` is a CellVerdict dict; `outcome` says what it means for the cell (canary logic);
        `injection` is the InjectionPrecision of an injected arm."""
        self._write(self.dir / "verdicts" / f"c{concurrency}.json", {
            "concurrency": concurrency, "comparison": comparison, "verdict": verdict, "outcome": outcome,
            "injection": injection,
        })

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
    def create(cls, root: str | Path, *, provenance: Provenance, sweep: dict[str, Any],
               environment: dict[str, Any], shard: tuple[int, int] | None = None) -> RunStore:
        store = cls(Path(root), provenance)
        store.root.mkdir(parents=True, exist_ok=True)
        existing = read_json(store.root / "run.json")
        body = {
            "sweep": sweep, "environment": environment,
            "started": existing["started"] if existing else now_iso(),
            "resumed": (existing.get("resumed", []) + [now_iso()]) if existing else [],
            "finished": None,
            "shard": list(shard) if shard else None,
        }
        write_json_atomic(store.root / "run.json", provenance.stamp() | body)
        return store

    def cell(self, dirname: str, provenance: Provenance | None = None) -> CellStore:
        return CellStore(self.root, dirname, provenance or self.provenance)

    def write_race_summary(self, summary: dict[str, Any]) -> None:
        write_json_atomic(self.root / "race" / "summary.json", self.provenance.stamp() | {"race": summary})

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


# ---------------------------------------------------------------------------------------------
# Reader


@dataclass(frozen=True)
class Failure:
    error_type: str
    message: str
    cell: str | None
    where: str
    at: str | None = None
    traceback: str | None = None

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Failure:
        return cls(data.get("error_type", "?"), data.get("message", ""), data.get("cell"),
                   data.get("where", ""), data.get("at"), data.get("traceback"))


@dataclass(frozen=True)
class UnitResult:
    """One (side, concurrency, repeat) of a cell: an eval run against one URL."""

    side: str
    concurrency: int
    repeat: int
    dir: Path
    summary: dict[str, Any] | None
    reused_from: str | None
    failure: Failure | None
    provenance: Provenance | None

    @property
    def done(self) -> bool:
        return self.summary is not None

    @property
    def records_path(self) -> Path:
        return self.dir / "records.jsonl"

    def records(self) -> list[QuestionRecord]:
        return read_records(self.records_path) if self.records_path.is_file() else []


@dataclass(frozen=True)
class VerdictEntry:
    """The verdict of one cell at one concurrency, with the comparison behind it."""

    concurrency: int
    verdict: dict[str, Any]
    comparison: dict[str, Any] | None
    outcome: dict[str, Any]
    injection: dict[str, Any] | None = None

    @property
    def name(self) -> str:
        return self.verdict.get("verdict", "?")

    @property
    def reason(self) -> str:
        return self.verdict.get("reason", "")

    @property
    def status(self) -> str:
        """pass, fail, infra or inconclusive, after the canary logic."""
        return self.outcome.get("status", "?")


@dataclass(frozen=True)
class CellResult:
    dirname: str
    name: str
    id: str
    resolved: dict[str, Any]
    servers: dict[str, Any]
    baseline_key: str | None
    canary: bool
    provenance: Provenance | None
    units: tuple[UnitResult, ...]
    kv: dict[tuple[int, int], dict[str, Any]]
    verdicts: dict[int, VerdictEntry]
    failure: Failure | None

    def unit(self, side: str, concurrency: int, repeat: int) -> UnitResult | None:
        for u in self.units:
            if (u.side, u.concurrency, u.repeat) == (side, concurrency, repeat):
                return u
        return None

    @property
    def concurrency(self) -> tuple[int, ...]:
        return tuple(self.resolved.get("concurrency", ()))


@dataclass(frozen=True)
class RunInfo:
    root: Path
    provenance: Provenance
    sweep: dict[str, Any]
    environment: dict[str, Any]
    started: str | None
    finished: str | None
    resumed: tuple[str, ...] = ()
    shard: tuple[int, int] | None = None
    merged_from: tuple[str, ...] = ()


@dataclass(frozen=True)
class RunResults:
    """Everything in one run folder, as typed records (what `report` and `bisect` read)."""

    info: RunInfo
    cells: tuple[CellResult, ...]
    race: dict[str, Any] | None
    summary: dict[str, Any] | None = field(default=None)

    def cell(self, name_or_id: str) -> CellResult:
        for c in self.cells:
            if name_or_id in (c.name, c.id, c.dirname):
                return c
        raise KeyError(f"no cell {name_or_id!r} in {self.info.root}")


def _load_unit(path: Path, side: str, concurrency: int, repeat: int) -> UnitResult:
    summary = read_json(path / "summary.json")
    failure = read_json(path / "failure.json")
    return UnitResult(
        side=side, concurrency=concurrency, repeat=repeat, dir=path,
        summary=summary["summary"] if summary else None,
        reused_from=summary.get("reused_from") if summary else None,
        failure=Failure.from_dict(failure) if failure else None,
        provenance=Provenance.from_stamp(summary) if summary else None,
    )


def _int_suffix(name: str, prefix: str) -> int | None:
    rest = name[len(prefix):] if name.startswith(prefix) else ""
    return int(rest) if rest.isdigit() else None


def load_cell(path: Path) -> CellResult:
    meta = read_json(path / "cell.json") or {}
    name, _, cell_id = path.name.rpartition("--")
    units = []
    for side in SIDES:
        for cdir in sorted((path / side).glob("c*")):
            c = _int_suffix(cdir.name, "c")
            for rdir in sorted(cdir.glob("r*")):
                r = _int_suffix(rdir.name, "r")
                if c is not None and r is not None:
                    units.append(_load_unit(rdir, side, c, r))
    kv = {}
    for kfile in sorted((path / "kv").glob("c*-r*.json")):
        data = read_json(kfile) or {}
        kv[(data["concurrency"], data["repeat"])] = data.get("kv", {})
    verdicts = {}
    for vfile in sorted((path / "verdicts").glob("c*.json")):
        data = read_json(vfile) or {}
        verdicts[data["concurrency"]] = VerdictEntry(data["concurrency"], data.get("verdict", {}),
                                                     data.get("comparison"), data.get("outcome", {}),
                                                     data.get("injection"))
    failure = read_json(path / "failure.json")
    return CellResult(
        dirname=path.name, name=meta.get("name", name), id=meta.get("id", cell_id),
        resolved=meta.get("resolved", {}), servers=meta.get("servers", {}),
        baseline_key=meta.get("baseline_key"), canary=bool(meta.get("canary", False)),
        provenance=Provenance.from_stamp(meta) if meta else None,
        units=tuple(sorted(units, key=lambda u: (u.side, u.concurrency, u.repeat))),
        kv=dict(sorted(kv.items())), verdicts=dict(sorted(verdicts.items())),
        failure=Failure.from_dict(failure) if failure else None,
    )


def donors(root: Path, baseline_key: str, *, exclude: str) -> list[CellResult]:
    """Cells of the run folder whose baselines another cell with `baseline_key` may reuse."""
    out = []
    for path in sorted((Path(root) / "cells").glob("*--*")):
        if path.name == exclude:
            continue
        meta = read_json(path / "cell.json")
        if meta and meta.get("baseline_key") == baseline_key:
            out.append(load_cell(path))
    return out


def load_run(root: str | Path) -> RunResults:
    """Read a run folder (finished, interrupted or merged). Raises FileNotFoundError without run.json."""
    root = Path(root)
    run = read_json(root / "run.json")
    if run is None:
        raise FileNotFoundError(f"{root} is not a pdcheck run folder: it has no run.json")
    info = RunInfo(
        root=root, provenance=Provenance.from_stamp(run), sweep=run.get("sweep", {}),
        environment=run.get("environment", {}), started=run.get("started"), finished=run.get("finished"),
        resumed=tuple(run.get("resumed", ())), shard=tuple(run["shard"]) if run.get("shard") else None,
        merged_from=tuple(run.get("merged_from", ())),
    )
    cells = tuple(load_cell(p) for p in sorted((root / "cells").glob("*--*")) if p.is_dir())
    race = read_json(root / "race" / "summary.json")
    return RunResults(info=info, cells=cells, race=race.get("race") if race else None,
                      summary=read_json(root / "summary.json"))
