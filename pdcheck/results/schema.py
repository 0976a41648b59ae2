"""The persisted schema of a run folder: one msgspec Struct per JSON file the store writes.

Every file is a `Stamped` struct (schema version and provenance at its top level), encoded and
decoded by `pdcheck.results._files` only. The analysis results inside (PairedComparison,
CellVerdict, EarlyStop, InjectionPrecision, Attribution, Outcome) are the analysis layer's own
frozen dataclasses, which msgspec encodes and decodes by their type hints like the structs here.

Versions: 1 is what pdcheck wrote before this schema (the same layout, with an early stop's
evidence inside the eval summary and partial verdict dicts for levels not judged); it still
loads. 2 adds `UnitFile.early_stop`, `VerdictFile.carried_from` and `EvalSummary.stopped`.
"""

from __future__ import annotations

import json
from typing import Any, TypeVar

import msgspec

from pdcheck import __version__
from pdcheck.analysis.attribution import Attribution
from pdcheck.analysis.exact import ExactCheck
from pdcheck.analysis.injection import InjectionPrecision
from pdcheck.analysis.kv_digest import KvDigestSummary
from pdcheck.analysis.paired import PairedComparison
from pdcheck.analysis.sequential import EarlyStop
from pdcheck.analysis.transfer_evidence import PrefillerLogEvents
from pdcheck.analysis.verdict import CellVerdict, Outcome, Status, Verdict
from pdcheck.config.cells import Side
from pdcheck.contracts.plugin_files import InjectionRecord
from pdcheck.contracts.server_records import KvTransferMetrics, TopologyRecord
from pdcheck.evals.summary import EvalSummary

T = TypeVar("T")

STORE_SCHEMA_VERSION = 2
SUPPORTED_SCHEMA_VERSIONS = (1, 2)
# A cell's server logs, one `<role>-<index>.log` each, under its folder.
CELL_LOGS_DIR = "logs"


def to_json(value: object) -> str:
    """The JSON of a struct or analysis dataclass, as the store writes it (indented, keys sorted).

    The json module writes the text: it keeps NaN and Infinity (an MDE can be infinite), which
    msgspec's JSON encoder would turn into null.
    """
    return json.dumps(msgspec.to_builtins(value), indent=2, sort_keys=True)


def from_json(data: Any, kind: type[T]) -> T:
    """`kind` from JSON text or from what `json.loads` returned; raises msgspec.ValidationError."""
    loaded = json.loads(data) if isinstance(data, str | bytes) else data
    return msgspec.convert(loaded, kind, str_keys=True)


class Provenance(msgspec.Struct, frozen=True, kw_only=True):
    """What produced a file: stamped into every JSON the store writes."""

    pdcheck_version: str = __version__
    vllm_version: str | None = None
    vllm_commit: str | None = None
    dataset_sha256: str | None = None


class Stamped(msgspec.Struct, frozen=True, kw_only=True):
    """The top-level fields of every file: its schema version and its provenance, flat."""

    schema_version: int = STORE_SCHEMA_VERSION
    pdcheck_version: str = "unknown"
    vllm_version: str | None = None
    vllm_commit: str | None = None
    dataset_sha256: str | None = None

    @property
    def provenance(self) -> Provenance:
        return Provenance(
            pdcheck_version=self.pdcheck_version,
            vllm_version=self.vllm_version,
            vllm_commit=self.vllm_commit,
            dataset_sha256=self.dataset_sha256,
        )


def stamp(provenance: Provenance) -> dict[str, Any]:
    """The keyword arguments that stamp a file with `provenance` at the current schema version."""
    return {
        "schema_version": STORE_SCHEMA_VERSION,
        "pdcheck_version": provenance.pdcheck_version,
        "vllm_version": provenance.vllm_version,
        "vllm_commit": provenance.vllm_commit,
        "dataset_sha256": provenance.dataset_sha256,
    }


class Selection(msgspec.Struct, frozen=True, kw_only=True):
    """Which cells of the sweep file a run selected (resume reuses it)."""

    only: tuple[str, ...] = ()
    keyword: str | None = None
    shard: tuple[int, int] | None = None
    runner: str | None = None


class SweepInfo(msgspec.Struct, frozen=True, kw_only=True):
    name: str
    file: str
    sha256: str
    cells: tuple[str, ...] | None = None
    selection: Selection | None = None


class RunFile(Stamped, frozen=True, kw_only=True):
    """run.json: what ran, where, and when."""

    sweep: SweepInfo
    # `pdcheck.serving.environment.collect_environment()`, or {"attached": True}: serving's shape.
    environment: dict[str, Any]
    started: str
    finished: str | None = None
    resumed: tuple[str, ...] = ()
    shard: tuple[int, int] | None = None
    merged_from: tuple[str, ...] = ()
    shards: tuple[tuple[int, int] | None, ...] = ()


class CellFile(Stamped, frozen=True, kw_only=True):
    """cell.json: the resolved cell and the servers that ran it (their content is serving's)."""

    name: str
    id: str
    dirname: str
    resolved: dict[str, Any]
    baseline_key: str | None
    servers: tuple[TopologyRecord, ...] = ()
    canary: bool = False


class FailureFile(Stamped, frozen=True, kw_only=True):
    """failure.json: a unit or a cell failed; the error, where, and when."""

    error_type: str
    message: str
    cell: str | None
    where: str
    at: str | None = None
    traceback: str | None = None

    @property
    def first_line(self) -> str:
        return self.message.splitlines()[0] if self.message else ""


class UnitFile(Stamped, frozen=True, kw_only=True):
    """summary.json of a unit: written last, it marks the unit done."""

    side: Side
    concurrency: int
    repeat: int
    summary: EvalSummary
    reused_from: str | None = None
    # The stop rule's decision when it ended this PD unit early.
    early_stop: EarlyStop | None = None


class KvEvidence(msgspec.Struct, frozen=True, kw_only=True):
    """What the decoders saw during one PD unit."""

    # One delta per decoder over the unit; empty when no metrics URL was known (attach mode).
    decoders: tuple[KvTransferMetrics, ...] = ()
    metrics_urls: tuple[str, ...] = ()
    # The vLLM plugin's injection records of this unit.
    injections: tuple[InjectionRecord, ...] | None = None
    # The join of the PD servers' KV digests (serving.kv_digest); None when no server wrote any.
    kv_digest: KvDigestSummary | None = None
    # Release events in the prefillers' logs over the unit; None when pdcheck has no logs (attach).
    prefiller_events: PrefillerLogEvents | None = None


class KvFile(Stamped, frozen=True, kw_only=True):
    """kv/c<N>-r<k>.json."""

    concurrency: int
    repeat: int
    kv: KvEvidence


class VerdictFile(Stamped, frozen=True, kw_only=True):
    """verdicts/c<N>.json: the verdict of one level, the comparison behind it and its outcome."""

    concurrency: int
    verdict: CellVerdict
    outcome: Outcome
    comparison: PairedComparison | None = None
    injection: InjectionPrecision | None = None
    # The lower level whose flag this level carries (early stop skipped it).
    carried_from: int | None = None
    # Greedy identity against the baseline, judged or not (cells in bit-exact mode only).
    exact: ExactCheck | None = None


class LevelResult(msgspec.Struct, frozen=True, kw_only=True):
    """summary.json's outcome of one cell at one concurrency."""

    concurrency: int
    status: Status
    verdict: Verdict
    canary: bool
    reason: str

    @property
    def outcome(self) -> Outcome:
        return Outcome(self.status, self.verdict, self.canary, self.reason)


class CellSummary(msgspec.Struct, frozen=True, kw_only=True):
    name: str
    id: str
    dirname: str
    canary: bool
    baseline_reused_from: tuple[str, ...]
    results: tuple[LevelResult, ...]


class RaceOutcome(msgspec.Struct, frozen=True, kw_only=True):
    """The race harness's run inside a sweep; `result` is `pdcheck race --json` (the harness's schema)."""

    status: Status
    reason: str
    exit_code: int | None = None
    argv: tuple[str, ...] = ()
    duration_s: float | None = None
    result: dict[str, Any] | None = None
    # The sweep's `environments:` entry whose python ran the harness; None: pdcheck's own.
    environment: str | None = None

    def findings_by_family(self) -> dict[str, int]:
        """Seeds with findings per family, summed over the harness's variants."""
        families: dict[str, int] = {}
        for variant in (self.result or {}).get("variants", []):
            for family, n in variant.get("seeds_by_family", {}).items():
                families[family] = families.get(family, 0) + n
        return families


class RaceFile(Stamped, frozen=True, kw_only=True):
    """race/summary.json."""

    race: RaceOutcome


class Counts(msgspec.Struct, frozen=True, kw_only=True):
    status: dict[str, int]
    verdict: dict[str, int]


class RunSummary(Stamped, frozen=True, kw_only=True):
    """summary.json: every cell's outcomes, attribution, the race, counts and the exit code.

    Written last: its presence means the run finished.
    """

    sweep: str | None
    cells: tuple[CellSummary, ...]
    attribution: tuple[Attribution, ...]
    race: RaceOutcome | None
    counts: Counts
    exit_code: int
    # The harness in each other environment's python (race/<name>/summary.json).
    environment_races: tuple[RaceOutcome, ...] = ()
