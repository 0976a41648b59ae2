"""The results store: layout, atomic JSON, provenance stamps, resume markers, and the typed reader."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET

import pytest

from pdcheck.analysis.verdict import CellVerdict, Status, Verdict, judge
from pdcheck.contracts.server_records import KvTransferMetrics
from pdcheck.evals.records import QuestionRecord, RecordWriter
from pdcheck.report.junit import render_junit
from pdcheck.results.schema import STORE_SCHEMA_VERSION, KvEvidence, SweepInfo
from pdcheck.results.store import Provenance, create_run, load_run
from pdcheck.results.summary import summarize
from tests.unit.sweep.builders import unit_summary

PROV = Provenance(vllm_version="0.32.0", vllm_commit="abc123", dataset_sha256="d" * 64)


def _record(i: int, correct: bool = True) -> QuestionRecord:
    return QuestionRecord(
        index=i, prompt_sha256="p", gold="1", ok=True, answer="1", correct=correct
    )


def write_record(path, record: QuestionRecord) -> None:
    with RecordWriter(path) as writer:
        writer.write(record)


def _store(tmp_path):
    return create_run(
        tmp_path / "run",
        provenance=PROV,
        sweep=SweepInfo(name="s", file="s.yaml", sha256="x"),
        environment={"cpu_count": 2},
    )


def _fill_cell(
    store, dirname="m-p1x1-d1x1-async-fixes-on--deadbeef", canary=False, verdict=Verdict.PASS
):
    cell = store.cell(dirname)
    cell.write_cell(
        resolved={"concurrency": [1]},
        name=dirname.split("--")[0],
        cell_id=dirname.split("--")[1],
        baseline_key="bk",
        canary=canary,
    )
    for side in ("baseline", "pd"):
        for i in range(3):
            write_record(cell.records_path(side, 1, 0), _record(i))
        cell.write_unit_summary(side, 1, 0, unit_summary([_record(i) for i in range(3)]))
    cell.write_kv(1, 0, KvEvidence(decoders=(KvTransferMetrics(external_kv_tokens=42.0),)))
    outcome = judge(verdict, "why", canary=canary)
    cell.write_verdict(1, verdict=CellVerdict(verdict, "why", n_pairs=3), outcome=outcome)
    return cell


def test_every_json_is_stamped_and_no_temp_files_remain(tmp_path):
    """Every JSON in a run folder has schema_version, pdcheck/vLLM versions and dataset sha; no .tmp left."""
    store = _store(tmp_path)
    _fill_cell(store)
    store.finish(summarize(load_run(store.root)))
    files = list(store.root.rglob("*.json"))
    assert len(files) >= 6
    for path in files:
        data = json.loads(path.read_text())
        assert data["schema_version"] == STORE_SCHEMA_VERSION, path
        assert data["vllm_version"] == "0.32.0" and data["vllm_commit"] == "abc123", path
        assert data["dataset_sha256"] == "d" * 64 and data["pdcheck_version"], path
    assert not list(store.root.rglob("*.tmp"))


def test_reader_round_trips_units_kv_verdicts(tmp_path):
    """load_run returns what was written: units with records, kv evidence per (c, r), verdicts per c."""
    store = _store(tmp_path)
    _fill_cell(store)
    run = load_run(store.root)
    assert run.info.sweep.name == "s" and run.info.finished is None
    cell = run.cells[0]
    assert cell.id == "deadbeef" and cell.name == "m-p1x1-d1x1-async-fixes-on"
    assert [(u.side, u.concurrency, u.repeat, u.done) for u in cell.units] == [
        ("baseline", 1, 0, True),
        ("pd", 1, 0, True),
    ]
    assert [r.index for r in cell.unit("pd", 1, 0).records()] == [0, 1, 2]
    assert cell.kv[(1, 0)].decoders[0].external_kv_tokens == 42
    assert cell.verdicts[1].verdict.verdict is Verdict.PASS
    assert cell.verdicts[1].outcome.status is Status.PASS


def test_unit_is_done_only_after_its_summary_and_failure_is_cleared(tmp_path):
    """Resume marker: records alone do not make a unit done; a later success clears failure.json."""
    cell = _store(tmp_path).cell("x--00000000")
    write_record(cell.records_path("pd", 8, 0), _record(0))
    assert not cell.unit_done("pd", 8, 0)
    cell.write_unit_failure("pd", 8, 0, RuntimeError("server went away"))
    unit = load_run(tmp_path / "run").cells[0].unit("pd", 8, 0)
    assert unit.failure.error_type == "RuntimeError" and not unit.done
    cell.write_unit_summary("pd", 8, 0, unit_summary([_record(0)]))
    assert cell.unit_done("pd", 8, 0)
    assert load_run(tmp_path / "run").cells[0].unit("pd", 8, 0).failure is None


def test_baseline_reuse_copies_records_and_says_from_where(tmp_path):
    """A reused baseline unit has the same records and names the cell it came from (the report says so)."""
    store = _store(tmp_path)
    source = _fill_cell(store)
    target = store.cell("other--11111111")
    target.copy_baseline_unit(source, 1, 0)
    unit = load_run(store.root).cell("11111111").unit("baseline", 1, 0)
    assert unit.reused_from == source.dirname
    assert [r.index for r in unit.records()] == [0, 1, 2]


def test_resumed_run_keeps_started_and_logs_resume(tmp_path):
    """Re-creating a run folder (resume) keeps its start time and records when it resumed."""
    first = json.loads((_store(tmp_path).root / "run.json").read_text())
    again = json.loads((_store(tmp_path).root / "run.json").read_text())
    assert again["started"] == first["started"] and len(again["resumed"]) == 1


def test_summary_and_junit_carry_verdict_reasons(tmp_path):
    """An unflagged canary is a junit failure with the reason; a failed unit gives an infra error; exit 1."""
    store = _store(tmp_path)
    _fill_cell(store)
    _fill_cell(store, "m-p1x1-d1x1-async-inject-zero--22222222", canary=True, verdict=Verdict.PASS)
    broken = store.cell("m-broken--33333333")
    broken.write_cell(
        resolved={"concurrency": [1, 8]},
        name="m-broken",
        cell_id="33333333",
        baseline_key="bk",
        canary=False,
    )
    for c in (1, 8):
        broken.write_unit_failure("pd", c, 0, RuntimeError("prefill exited with code 1"))
    run = load_run(store.root)
    summary = summarize(run)
    assert summary.exit_code == 1
    assert summary.counts.status == {"fail": 1, "infra": 2, "pass": 1}
    suite = ET.fromstring(render_junit(run))
    assert suite.get("tests") == "4" and suite.get("failures") == "1" and suite.get("errors") == "2"
    failure = suite.find(".//testcase[@classname='s.m-p1x1-d1x1-async-inject-zero']/failure")
    assert "canary NOT flagged" in failure.get("message")
    error = suite.find(".//testcase[@classname='s.m-broken'][@name='c8']/error")
    assert "prefill exited with code 1" in error.get("message")


def test_load_run_rejects_a_folder_without_run_json(tmp_path):
    """Reading something that is not a run folder fails with a clear message, not an empty result."""
    with pytest.raises(FileNotFoundError, match=r"no run.json"):
        load_run(tmp_path)


def test_torn_record_line_is_cut_before_a_resumed_unit_appends(tmp_path):
    """A kill mid-write leaves a partial line; the store trims it so resumed appends stay readable."""
    cell = _store(tmp_path).cell("x--00000000")
    path = cell.records_path("pd", 1, 0)
    write_record(path, _record(0))
    with open(path, "a") as f:
        f.write('{"index": 1, "prom')
    path = cell.records_path("pd", 1, 0)
    write_record(path, _record(1))
    assert [r.index for r in load_run(tmp_path / "run").cells[0].unit("pd", 1, 0).records()] == [
        0,
        1,
    ]
