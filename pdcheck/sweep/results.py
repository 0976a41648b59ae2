"""Read a run folder into typed records: `load_run(dir) -> RunResults` (what report and bisect read)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pdcheck.evals.records import QuestionRecord, read_records
from pdcheck.sweep._files import SIDES, Provenance, read_json


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
        return cls(
            data.get("error_type", "?"),
            data.get("message", ""),
            data.get("cell"),
            data.get("where", ""),
            data.get("at"),
            data.get("traceback"),
        )


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
        side=side,
        concurrency=concurrency,
        repeat=repeat,
        dir=path,
        summary=summary["summary"] if summary else None,
        reused_from=summary.get("reused_from") if summary else None,
        failure=Failure.from_dict(failure) if failure else None,
        provenance=Provenance.from_stamp(summary) if summary else None,
    )


def _int_suffix(name: str, prefix: str) -> int | None:
    rest = name[len(prefix) :] if name.startswith(prefix) else ""
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
        verdicts[data["concurrency"]] = VerdictEntry(
            data["concurrency"],
            data.get("verdict", {}),
            data.get("comparison"),
            data.get("outcome", {}),
            data.get("injection"),
        )
    failure = read_json(path / "failure.json")
    return CellResult(
        dirname=path.name,
        name=meta.get("name", name),
        id=meta.get("id", cell_id),
        resolved=meta.get("resolved", {}),
        servers=meta.get("servers", {}),
        baseline_key=meta.get("baseline_key"),
        canary=bool(meta.get("canary", False)),
        provenance=Provenance.from_stamp(meta) if meta else None,
        units=tuple(sorted(units, key=lambda u: (u.side, u.concurrency, u.repeat))),
        kv=dict(sorted(kv.items())),
        verdicts=dict(sorted(verdicts.items())),
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
        root=root,
        provenance=Provenance.from_stamp(run),
        sweep=run.get("sweep", {}),
        environment=run.get("environment", {}),
        started=run.get("started"),
        finished=run.get("finished"),
        resumed=tuple(run.get("resumed", ())),
        shard=tuple(run["shard"]) if run.get("shard") else None,
        merged_from=tuple(run.get("merged_from", ())),
    )
    cells = tuple(load_cell(p) for p in sorted((root / "cells").glob("*--*")) if p.is_dir())
    race = read_json(root / "race" / "summary.json")
    return RunResults(
        info=info,
        cells=cells,
        race=race.get("race") if race else None,
        summary=read_json(root / "summary.json"),
    )
