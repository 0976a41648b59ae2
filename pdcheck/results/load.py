"""Read a run folder into typed records: `load_run(dir) -> RunResults` (what report and bisect read).

Every file is decoded into its `pdcheck.results.schema` struct; a file that does not match raises
ResultsFileError naming it. Records files are read when asked for (`UnitResult.records`), or all
at once by `check_run`, which a resume and a merge run before they start or write anything.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import msgspec
from pydantic import ValidationError

from pdcheck.analysis.sequential import EarlyStop
from pdcheck.config import Cell
from pdcheck.config.cells import SIDES, Side
from pdcheck.contracts.server_records import TopologyRecord
from pdcheck.errors import ResultsFileError
from pdcheck.evals.records import QuestionRecord, read_records
from pdcheck.evals.summary import EvalSummary
from pdcheck.results._files import read_file
from pdcheck.results.schema import (
    CELL_LOGS_DIR,
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
)

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class UnitResult:
    """One (side, concurrency, repeat) of a cell: an eval run against one URL."""

    side: Side
    concurrency: int
    repeat: int
    dir: Path
    file: UnitFile | None
    failure: FailureFile | None

    @property
    def done(self) -> bool:
        return self.file is not None

    @property
    def summary(self) -> EvalSummary | None:
        return self.file.summary if self.file is not None else None

    @property
    def reused_from(self) -> str | None:
        return self.file.reused_from if self.file is not None else None

    @property
    def early_stop(self) -> EarlyStop | None:
        return self.file.early_stop if self.file is not None else None

    @property
    def provenance(self) -> Provenance | None:
        return self.file.provenance if self.file is not None else None

    @property
    def records_path(self) -> Path:
        return self.dir / "records.jsonl"

    def records(self) -> list[QuestionRecord]:
        return read_records(self.records_path) if self.records_path.is_file() else []


@dataclass(frozen=True)
class CellResult:
    dirname: str
    name: str
    id: str
    resolved: dict[str, Any]
    servers: tuple[TopologyRecord, ...]
    baseline_key: str | None
    canary: bool
    provenance: Provenance | None
    units: tuple[UnitResult, ...]
    kv: dict[tuple[int, int], KvEvidence]
    verdicts: dict[int, VerdictFile]
    failure: FailureFile | None

    def unit(self, side: Side, concurrency: int, repeat: int) -> UnitResult | None:
        for u in self.units:
            if (u.side, u.concurrency, u.repeat) == (side, concurrency, repeat):
                return u
        return None

    @functools.cached_property
    def spec(self) -> Cell | None:
        """The resolved cell of cell.json, or None when it is not a valid cell for this pdcheck."""
        try:
            return Cell.model_validate(self.resolved)
        except ValidationError as exc:
            logger.warning("%s: cell.json holds no valid cell (%s)", self.dirname, exc)
            return None

    @property
    def concurrency(self) -> tuple[int, ...]:
        # From the raw dict, not `spec`: the levels stay readable when the rest of the cell is not.
        return tuple(self.resolved.get("concurrency", ()))


@dataclass(frozen=True)
class RunInfo:
    root: Path
    file: RunFile

    @property
    def provenance(self) -> Provenance:
        return self.file.provenance

    @property
    def sweep(self) -> SweepInfo:
        return self.file.sweep

    @property
    def environment(self) -> dict[str, Any]:
        return self.file.environment

    @property
    def started(self) -> str:
        return self.file.started

    @property
    def finished(self) -> str | None:
        return self.file.finished

    @property
    def merged_from(self) -> tuple[str, ...]:
        return self.file.merged_from


@dataclass(frozen=True)
class RunResults:
    """Everything in one run folder, as typed records (what `report` and `bisect` read).

    `summary` is the run's summary.json, or None while the run is unfinished.
    """

    info: RunInfo
    cells: tuple[CellResult, ...]
    race: RaceOutcome | None
    summary: RunSummary | None = None
    # The harness in each `environments:` entry's python, by name (race/<name>/summary.json).
    environment_races: tuple[RaceOutcome, ...] = ()

    def cell(self, name_or_id: str) -> CellResult:
        for c in self.cells:
            if name_or_id in (c.name, c.id, c.dirname):
                return c
        raise KeyError(f"no cell {name_or_id!r} in {self.info.root}")

    def log_files(self, cell: CellResult) -> list[Path]:
        """The server logs the cell kept, by name (none in attach mode or a copy without them)."""
        return sorted((self.info.root / "cells" / cell.dirname / CELL_LOGS_DIR).glob("*.log"))


def kv_tokens(kv: Mapping[tuple[int, int], KvEvidence], concurrency: int) -> int | None:
    """KV tokens the decoders received over the level's PD units; None when no metrics were scraped."""
    total = None
    for (c, _r), evidence in kv.items():
        if c != concurrency:
            continue
        for delta in evidence.decoders:
            total = (total or 0) + int(delta.external_kv_tokens)
    return total


def _load_unit(path: Path, side: Side, concurrency: int, repeat: int) -> UnitResult:
    unit = read_file(path / "summary.json", UnitFile, upgrade=_v1_unit)
    failure = read_file(path / "failure.json", FailureFile)
    return UnitResult(side, concurrency, repeat, path, unit, failure)


def _v1_unit(version: int, data: dict[str, Any]) -> dict[str, Any]:
    """Version 1 kept an early stop's evidence inside the eval summary."""
    summary = data.get("summary")
    stop = summary.get("early_stop") if isinstance(summary, dict) else None
    if version != 1 or data.get("early_stop") is not None or stop is None:
        return data
    return {**data, "early_stop": stop}


def _v1_cell(version: int, data: dict[str, Any]) -> dict[str, Any]:
    """Version 1's cell.json held the servers planned again after the run, not the ones that
    ran (issue 19); they are dropped rather than shown as what ran."""
    if version != 1:
        return data
    return {k: v for k, v in data.items() if k != "servers"}


def _int_suffix(name: str, prefix: str) -> int | None:
    rest = name[len(prefix) :] if name.startswith(prefix) else ""
    return int(rest) if rest.isdigit() else None


# The free-form dicts of the schema (filled by other layers) hold what these readers use: the
# levels of `CellResult.concurrency`, and what the report shows of the environment and the race
# harness's result. Checked when read, so a wrong type there is a bad file, not a crash later.
class _Levels(msgspec.Struct):
    concurrency: tuple[int, ...] = ()


class _FixFacts(msgspec.Struct):
    state: Literal["present", "absent", "unknown"]
    form: str | None = None


class _VllmFacts(msgspec.Struct):
    vllm_version: str | None = None
    vllm_dist: str | None = None
    vllm_commit: str | None = None
    nixl_version: str | None = None
    torch_version: str | None = None
    # `FixStatus.to_dict()` (pdcheck.contracts.fixes); runs written before fix forms hold bools.
    fixes: dict[str, _FixFacts | bool | None] | None = None


class _Device(msgspec.Struct):
    name: str = "?"


class _Gpus(msgspec.Struct):
    devices: list[_Device] | None = None


class _Environment(msgspec.Struct):
    pdcheck_version: str | None = None
    cpu_count: int | None = None
    vllm: _VllmFacts | None = None
    gpus: _Gpus | None = None


class _RaceVariant(msgspec.Struct):
    variant: str = "?"
    seeds: int = 0
    seeds_with_findings: int = 0
    seeds_by_family: dict[str, int] = {}
    median_first_step_by_family: dict[str, float] | None = None
    findings_by_kind: dict[str, int] | None = None
    steps_per_s: float = 0
    examples: list[dict[str, Any] | None] | None = None


class _RaceResult(msgspec.Struct):
    fixes_absent: list[str] | None = None
    variants: list[_RaceVariant] = []


def _check_shape(value: object, shape: type, *, path: Path, key: str) -> None:
    try:
        msgspec.convert(value, shape)
    except msgspec.ValidationError as exc:
        raise ResultsFileError(f"{key} is malformed: {exc}", path=path) from None


def read_cell_file(path: Path) -> CellFile | None:
    cell = read_file(path / "cell.json", CellFile, upgrade=_v1_cell)
    if cell is not None:
        _check_shape(cell.resolved, _Levels, path=path / "cell.json", key="resolved")
    return cell


def load_cell(path: Path) -> CellResult:
    meta = read_cell_file(path)
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
        k = read_file(kfile, KvFile)
        if k is not None:
            kv[(k.concurrency, k.repeat)] = k.kv
    verdicts = {}
    for vfile in sorted((path / "verdicts").glob("c*.json")):
        v = read_file(vfile, VerdictFile)
        if v is not None:
            verdicts[v.concurrency] = v
    return CellResult(
        dirname=path.name,
        name=meta.name if meta else name,
        id=meta.id if meta else cell_id,
        resolved=meta.resolved if meta else {},
        servers=meta.servers if meta else (),
        baseline_key=meta.baseline_key if meta else None,
        canary=meta.canary if meta else False,
        provenance=meta.provenance if meta else None,
        units=tuple(sorted(units, key=lambda u: (u.side, u.concurrency, u.repeat))),
        kv=dict(sorted(kv.items())),
        verdicts=dict(sorted(verdicts.items())),
        failure=read_file(path / "failure.json", FailureFile),
    )


def donors(root: Path, baseline_key: str, *, exclude: str) -> list[CellResult]:
    """Cells of the run folder whose baselines another cell with `baseline_key` may reuse."""
    out = []
    for path in sorted((Path(root) / "cells").glob("*--*")):
        if path.name == exclude:
            continue
        meta = read_cell_file(path)
        if meta is not None and meta.baseline_key == baseline_key:
            out.append(load_cell(path))
    return out


def read_run_file(root: Path) -> RunFile | None:
    path = Path(root) / "run.json"
    run = read_file(path, RunFile)
    if run is not None:
        _check_shape(run.environment, _Environment, path=path, key="environment")
    return run


def _read_race_file(root: Path) -> RaceFile | None:
    return _read_race_summary(root / "race" / "summary.json")


def _read_environment_races(root: Path) -> tuple[RaceOutcome, ...]:
    files = sorted((root / "race").glob("*/summary.json"))
    return tuple(race.race for race in map(_read_race_summary, files) if race is not None)


def _read_race_summary(path: Path) -> RaceFile | None:
    race = read_file(path, RaceFile)
    if race is not None and race.race.result is not None:
        _check_shape(race.race.result, _RaceResult, path=path, key="race.result")
    return race


def check_run(root: str | Path) -> RunResults:
    """`load_run`, and every unit's records read too: a broken file anywhere in the folder raises
    ResultsFileError or InputFileError (file and line) now, not in the middle of a run."""
    run = load_run(root)
    for cell in run.cells:
        for unit in cell.units:
            unit.records()
    return run


def load_run(root: str | Path) -> RunResults:
    """Read a run folder (finished, interrupted or merged). Raises FileNotFoundError without run.json."""
    root = Path(root)
    run = read_run_file(root)
    if run is None:
        raise FileNotFoundError(f"{root} is not a pdcheck run folder: it has no run.json")
    cells = tuple(load_cell(p) for p in sorted((root / "cells").glob("*--*")) if p.is_dir())
    race = _read_race_file(root)
    return RunResults(
        info=RunInfo(root, run),
        cells=cells,
        race=race.race if race else None,
        summary=read_file(root / "summary.json", RunSummary),
        environment_races=_read_environment_races(root),
    )
