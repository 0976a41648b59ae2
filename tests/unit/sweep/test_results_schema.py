"""The persisted schema: every file of a real results folder round-trips through its typed model,
and a folder of an unknown schema version is refused with the file and the supported versions."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

import pytest

from pdcheck.analysis.verdict import Status, Verdict
from pdcheck.config import expand_cells, load_sweep
from pdcheck.contracts.plugin_files import InjectionRecord
from pdcheck.contracts.server_records import ServerPorts, ServerRecord, TopologyRecord
from pdcheck.errors import ConfigError, ResultsFileError
from pdcheck.results.schema import (
    CellFile,
    FailureFile,
    KvFile,
    RaceFile,
    RaceOutcome,
    RunFile,
    RunSummary,
    Stamped,
    SweepInfo,
    UnitFile,
    VerdictFile,
    from_json,
    to_json,
)
from pdcheck.results.store import Provenance, create_run, load_run
from pdcheck.serving import Endpoints
from pdcheck.sweep.engine import Engine, SweepOptions
from pdcheck.sweep.plan import Unit
from pdcheck.vllm_plugin.marker import InjectionLog
from tests.fakes.openai_server import echo_completion
from tests.unit.analysis.builders import injection
from tests.unit.sweep.conftest import answering


class CountingKvServer:
    """Wraps a responder: every answer adds 10 KV-transferred prompt tokens to the server's /metrics."""

    def __init__(self, respond):
        self.respond = respond
        self.server = None
        self.tokens = 0

    def __call__(self, body):
        self.tokens += 10
        self.server.metrics_text = (
            f'vllm:prompt_tokens_by_source_total{{source="external_kv_transfer"}} {self.tokens}\n'
        )
        return self.respond(body)


class FakeBackend:
    """The in-process fake servers of the unit tests, with decoder metrics and an injection log."""

    def __init__(self, baseline_url: str, pd_url: str, plugin_dir: Path):
        self.baseline_url, self.pd_url, self.plugin_dir = baseline_url, pd_url, plugin_dir
        self.gpu_indices = ()

    def provenance(self, cell):
        return Provenance(vllm_version="0.32.0", vllm_commit="abc")

    @contextlib.contextmanager
    def baseline(self, cell, *, gpus, cell_dir):
        yield Endpoints(baseline_url=self.baseline_url)

    @contextlib.contextmanager
    def pd(self, cell, *, gpus, cell_dir, prefill_key=None):
        decoder = ServerRecord(
            name="decode-0",
            role="decode",
            pid=0,
            argv=("vllm", "serve"),
            env={},
            url=self.pd_url,
            ports=ServerPorts(http=1, side_channel=2, vllm_port=3),
            gpus=(),
            cpu_bind=None,
            log_path="decode-0.log",
            plugin_dir=str(self.plugin_dir),
        )
        yield Endpoints(
            pd_url=self.pd_url,
            decoder_metrics_urls=(self.pd_url,),
            started=TopologyRecord(platform="cpu", servers=(decoder,)),
        )

    def close(self):
        pass


# Which struct each file of a run folder is, by its path inside the folder.
KINDS: dict[str, type[Stamped]] = {
    "run.json": RunFile,
    "summary.json": RunSummary,
    "race/summary.json": RaceFile,
    "cell.json": CellFile,
    "failure.json": FailureFile,
    "kv/": KvFile,
    "verdicts/": VerdictFile,
    "/summary.json": UnitFile,
}


def _kind(rel: str) -> type[Stamped]:
    if rel in KINDS:
        return KINDS[rel]
    for marker in ("kv/", "verdicts/"):
        if f"/{marker}" in rel:
            return KINDS[marker]
    name = rel.rsplit("/", 1)[-1]
    return FailureFile if name == "failure.json" else CellFile if name == "cell.json" else UnitFile


def _canonical(text: str) -> str:
    """The JSON's content: key order and int-versus-float spelling of a number do not count."""
    return json.dumps(json.loads(text, parse_int=float), sort_keys=True)


@pytest.fixture
def stored_run(sweep_file, gold_by_question, tmp_path) -> Path:
    """A real results folder: two arms, an early stop (a collapsing PD), a carried level, KV
    evidence from decoder metrics, an injection log, a failed unit, the race summary, finished."""
    from tests.fakes.openai_server import FakeOpenAIServer

    cells = expand_cells(load_sweep(sweep_file))
    plugin_dir = tmp_path / "plugin"
    plugin_dir.mkdir()
    inject = next(c for c in cells if c.arm.inject)
    tag = Unit(inject.id, "pd", 1, 0).run_tag
    # Written as the plugin writes them; a record of another unit is left out of this one's.
    log = InjectionLog(plugin_dir)
    for x_request_id in (f"{tag}-q00000", f"{tag}-q00003", f"pd-c4-r0-{inject.id}-q00001"):
        log.append(injection(x_request_id))
    wrong = CountingKvServer(answering(gold_by_question, wrong=True))
    with (
        FakeOpenAIServer(answering(gold_by_question)) as base,
        FakeOpenAIServer(wrong) as bad,
    ):
        wrong.server = bad
        store = create_run(
            tmp_path / "run",
            provenance=Provenance(vllm_version="0.32.0", vllm_commit="abc"),
            sweep=SweepInfo(name="fake", file=str(sweep_file), sha256="x"),
            environment={"cpu_count": 2, "vllm": {"vllm_version": "0.32.0"}},
        )
        store.write_race_summary(
            RaceOutcome(status=Status.PASS, reason="no findings", exit_code=0, result={})
        )
        engine = Engine(
            cells,
            store=store,
            backend=FakeBackend(base.url, bad.url, plugin_dir),
            options=SweepOptions(early_stop=True),
        )
        engine.execute()
        engine.cell_store(cells[0]).write_unit_failure(
            "baseline", 99, 0, RuntimeError("a unit that failed")
        )
        engine.finish()
    assert echo_completion  # the fake servers answer with the shared echo helper
    return store.root


def test_every_file_of_a_stored_run_round_trips_through_its_type(stored_run):
    """Each JSON file decodes into its struct and encodes back to the same JSON: no field is lost."""
    files = sorted(p for p in stored_run.rglob("*.json") if p.parent.name != ".gpu-leases")
    kinds = {}
    for path in files:
        rel = path.relative_to(stored_run).as_posix()
        kind = _kind(rel)
        typed = from_json(path.read_text(), kind)
        assert _canonical(to_json(typed)) == _canonical(path.read_text()), rel
        kinds[kind.__name__] = kinds.get(kind.__name__, 0) + 1
    assert set(kinds) == {
        "RunFile",
        "RunSummary",
        "RaceFile",
        "CellFile",
        "UnitFile",
        "FailureFile",
        "KvFile",
        "VerdictFile",
    }, kinds


def test_the_stored_run_reads_back_typed(stored_run):
    """The early stop, the carried level, the KV evidence and the injection precision come back typed."""
    run = load_run(stored_run)
    clean, injected = sorted(run.cells, key=lambda c: c.canary)
    pd_c1 = clean.unit("pd", 1, 0)
    assert pd_c1.early_stop is not None and pd_c1.early_stop.verdict is Verdict.REGRESSION
    assert pd_c1.summary.stopped and pd_c1.summary.n == len(pd_c1.records())
    assert clean.verdicts[4].carried_from == 1 and clean.verdicts[4].verdict.verdict.flagged
    assert clean.kv[(1, 0)].decoders[0].external_kv_tokens > 0
    assert clean.verdicts[1].verdict.kv_transferred_tokens > 0
    precision = injected.verdicts[1].injection
    assert precision is not None and precision.n_injected == 2
    records = injected.kv[(1, 0)].injections or ()
    assert all(isinstance(r, InjectionRecord) for r in records)
    assert sorted(r.x_request_id[-6:] for r in records) == ["q00000", "q00003"]
    assert run.summary is not None and run.summary.race.status is Status.PASS
    assert run.summary.exit_code == 1 and run.summary.attribution


def test_an_unknown_schema_version_is_refused_with_the_file_and_the_supported_versions(stored_run):
    """A file from a newer pdcheck: ResultsFileError (a ConfigError, exit 3) naming file and versions."""
    path = stored_run / "run.json"
    data = json.loads(path.read_text())
    path.write_text(json.dumps(data | {"schema_version": 99}))
    with pytest.raises(ResultsFileError) as info:
        load_run(stored_run)
    message = str(info.value)
    assert str(path) in message and "99" in message and "versions 1, 2" in message
    assert isinstance(info.value, ConfigError) and info.value.exit_code == 3


def test_a_malformed_file_names_itself_and_the_field(stored_run):
    """A verdict file with a wrong field is refused, naming the file and the field."""
    path = next((stored_run / "cells").glob("*/verdicts/c1.json"))
    data = json.loads(path.read_text())
    data["verdict"]["verdict"] = "MAYBE"
    path.write_text(json.dumps(data))
    with pytest.raises(
        ResultsFileError, match=r"c1.json: does not hold a valid VerdictFile.*verdict"
    ):
        load_run(stored_run)


V1_RUN = Path(__file__).parent / "data" / "v1-run"


def test_a_folder_written_before_the_typed_schema_still_loads(tmp_path):
    """A version-1 folder (pdcheck main c0809ea, see data/make_v1_run.py) loads typed, early stop
    included, and renders a report with the run's exit code."""
    from click.testing import CliRunner

    from pdcheck.cli import cli

    run = load_run(V1_RUN)
    (cell,) = run.cells
    assert run.info.file.schema_version == 1 and run.summary is not None
    pd_c1 = cell.unit("pd", 1, 0)
    assert pd_c1.early_stop is not None and pd_c1.early_stop.verdict is Verdict.REGRESSION
    assert cell.verdicts[1].verdict.verdict is Verdict.REGRESSION
    assert cell.verdicts[4].verdict.reason == "early stop: c1 was REGRESSION"
    assert cell.verdicts[4].outcome.status is Status.FAIL
    result = CliRunner().invoke(cli, ["report", str(V1_RUN), "--format", "json"])
    assert result.exit_code == 1, result.output
    assert json.loads(result.stdout)["exit_code"] == 1
