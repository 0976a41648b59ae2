"""Reading results folders: a malformed file is refused with its path (and line), never a traceback.

Property-based: one file of a real folder (the version-1 folder of `data/`, plus a race summary and
a failure sidecar of today's version) is cut short, garbled with random bytes, or replaced by
valid JSON of the wrong shape, and the folder is read by `check_run`, `sweep --resume`'s
`prepare`, `pdcheck report`, `pdcheck merge` and `pdcheck sweep --resume`.
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import event, given
from hypothesis import strategies as st

from pdcheck.analysis.verdict import Status
from pdcheck.config.load import SWEEPS_DIR
from pdcheck.errors import ConfigError, ExitCode, InputFileError
from pdcheck.results.load import check_run
from pdcheck.results.schema import RaceOutcome
from pdcheck.results.store import open_run
from pdcheck.sweep.run import SweepRequest, prepare
from tests.unit.bad_files import BAD_FILES, fresh_dir, garbled, run_cli, truncated, wrong_typed

V1_RUN = Path(__file__).parent / "data" / "v1-run"
# What `pdcheck.serving.environment.collect_environment` records (not attached: the report reads it all).
ENVIRONMENT = {
    "pdcheck_version": "0.1",
    "vllm": {
        "python": "/usr/bin/python3",
        "python_version": "3.11.7",
        "vllm_dist": "vllm",
        "vllm_version": "0.32.0",
        "vllm_path": "/site/vllm",
        "vllm_commit": "abc",
        "nixl_version": "0.6",
        "torch_version": "2.9",
        "fixes": {"zeroing": True, "reuse": None},
        "error": None,
        "build": "gpu",
    },
    "gpus": {"source": "nvidia-smi", "devices": [{"index": 0, "name": "H100", "uuid": "GPU-1"}]},
    "free_memory_bytes": 10**9,
    "cpu_count": 8,
}


def _race_result() -> dict:
    """`pdcheck race --json` with one finding, as the harness writes it."""
    from pdcheck.race.findings import Finding, Kind
    from pdcheck.race.run import RaceSummary, VariantResult

    finding = Finding(Kind.ZEROING_OF_LOAD_TARGET, 1, 3, (4,), "r00002", "zeroing", "d")
    variant = dict(
        variant="hybrid-align",
        seeds=2,
        seeds_with_findings=1,
        seeds_by_family={"ZEROING": 1},
        median_first_step_by_family={"ZEROING": 3.0},
        findings_by_kind={"ZEROING_OF_LOAD_TARGET": 5},
        propagated_findings=0,
        steps=900,
        sim_s=0.5,
        examples=(finding,),
    )
    return RaceSummary(
        "0.32.0", ("zeroing",), ("reuse",), None, 2, 0, 300, None, (VariantResult(**variant),)
    ).to_dict()


@pytest.fixture(scope="module")
def template(tmp_path_factory) -> Path:
    """A finished run folder with every kind of file, its sweep file beside it (so it resumes)."""
    root = tmp_path_factory.mktemp("template")
    run = root / "run"
    shutil.copytree(V1_RUN, run)
    # Any valid sweep: resume checks only that it is unchanged. Without boundary prompts, whose
    # planning would load three tokenizers in the unit tier.
    sweep = root / "sweep.yaml"
    shipped = (SWEEPS_DIR / "cpu-smoke.yaml").read_text()
    assert "  edges: true\n" in shipped
    sweep.write_text(shipped.replace("  edges: true\n", "  edges: false\n"))
    info = json.loads((run / "run.json").read_text())
    info["sweep"] |= {"file": str(sweep), "sha256": hashlib.sha256(sweep.read_bytes()).hexdigest()}
    info["environment"] = ENVIRONMENT
    (run / "run.json").write_text(json.dumps(info, indent=2))
    store = open_run(run)
    assert store is not None
    store.write_race_summary(
        RaceOutcome(status=Status.FAIL, reason="findings", exit_code=1, result=_race_result())
    )
    cell = next((run / "cells").iterdir()).name
    store.cell(cell).write_unit_failure("baseline", 99, 0, RuntimeError("a unit that failed"))
    return run


def _files(template: Path) -> list[str]:
    return sorted(
        str(p.relative_to(template))
        for p in template.rglob("*")
        if p.suffix in (".json", ".jsonl") and p.is_file()
    )


@st.composite
def broken_folders(draw: st.DrawFn, template: Path, root: Path) -> tuple[Path, Path]:
    """A copy of `template` with one JSON or JSONL file cut short, garbled, or of the wrong shape."""
    rel = draw(st.sampled_from(_files(template)))
    data = (template / rel).read_bytes()
    if rel.endswith(".jsonl"):
        lines = data.splitlines(keepends=True)
        i = draw(st.integers(0, len(lines) - 1))
        bad_line = draw(
            garbled(lines[i])
            | st.builds(lambda d: json.dumps(d).encode() + b"\n", wrong_typed(json.loads(lines[i])))
        )
        broken = b"".join([*lines[:i], bad_line, *lines[i + 1 :]])
    else:
        broken = draw(
            truncated(data)
            | garbled(data)
            | wrong_typed(json.loads(data)).map(lambda d: json.dumps(d).encode())
        )
    folder = fresh_dir(root) / "run"
    shutil.copytree(template, folder)
    (folder / rel).write_bytes(broken)
    return folder, folder / rel


def _refused_naming(exc: Exception, path: Path) -> None:
    assert isinstance(exc, InputFileError) and exc.exit_code == ExitCode.CONFIG, repr(exc)
    where = (
        rf"{re.escape(str(path))}(:\d+)?: "
        if path.suffix == ".jsonl"
        else rf"{re.escape(str(path))}: "
    )
    assert re.match(where, str(exc)), str(exc)


def _reads_or_refuses(read: Callable[[Path], object], folder: Path, path: Path) -> None:
    try:
        read(folder)
    except ConfigError as exc:
        event(f"refused: {type(exc).__name__}")
        _refused_naming(exc, path)
    else:
        event("read")


@BAD_FILES
@given(data=st.data())
def test_check_run_reads_a_folder_or_refuses_the_broken_file(template, tmp_path, data):
    """Every file of the folder, records included, is read typed: a broken one raises
    InputFileError naming it (and the line, for records), and nothing else escapes."""
    folder, path = data.draw(broken_folders(template, tmp_path))
    _reads_or_refuses(check_run, folder, path)


@BAD_FILES
@given(data=st.data())
def test_resume_refuses_a_broken_folder_before_starting(template, tmp_path, data):
    """`sweep --resume` reads the whole folder while preparing, before anything starts or is written."""
    folder, path = data.draw(broken_folders(template, tmp_path))
    _reads_or_refuses(lambda f: prepare(SweepRequest(resume=f)), folder, path)


def _cli_refuses_or_runs(code: int, output: str, path: Path) -> None:
    assert "Traceback" not in output
    event(f"exit {code}")
    if code == ExitCode.CONFIG:
        assert str(path) in output, output


@BAD_FILES
@given(data=st.data(), fmt=st.sampled_from(["md", "json", "junit"]))
def test_report_exits_3_naming_a_broken_file(template, tmp_path, data, fmt):
    """`pdcheck report` renders a readable folder, or exits 3 naming the broken file; no traceback."""
    folder, path = data.draw(broken_folders(template, tmp_path))
    code, output = run_cli("report", str(folder), "--format", fmt)
    _cli_refuses_or_runs(code, output, path)


@BAD_FILES
@given(data=st.data())
def test_merge_exits_3_naming_a_broken_file_and_writes_nothing(template, tmp_path, data):
    """`pdcheck merge` reads every shard whole first: a broken one exits 3, naming the file,
    before the merged folder is made."""
    folder, path = data.draw(broken_folders(template, tmp_path))
    out = folder.parent / "merged"
    code, output = run_cli("merge", str(folder), "--out", str(out))
    _cli_refuses_or_runs(code, output, path)
    if code == ExitCode.CONFIG:
        assert not out.exists()


@pytest.mark.parametrize(
    ("rel", "damage"),
    [
        ("run.json", lambda b: b[: len(b) // 2]),
        ("cells/fake-p1x1-d1x1-async-fixes-on--6a9640bd/cell.json", lambda b: b"\xff" + b),
        (
            "cells/fake-p1x1-d1x1-async-fixes-on--6a9640bd/pd/c1/r0/records.jsonl",
            lambda b: b.replace(b'"index":', b'"index":"', 1),
        ),
        (
            "cells/fake-p1x1-d1x1-async-fixes-on--6a9640bd/baseline/c4/r0/records.jsonl",
            lambda b: b"not json\n" + b,
        ),
    ],
)
def test_sweep_resume_on_a_broken_folder_exits_3_and_starts_nothing(
    template, tmp_path, monkeypatch, rel, damage
):
    """`pdcheck sweep --resume DIR` names the broken file (and the line) and exits 3 before any
    server could start."""
    import pdcheck.sweep.run

    def no_servers(*args, **kwargs):
        raise AssertionError("a server backend was made for a broken folder")

    monkeypatch.setattr(pdcheck.sweep.run, "make_backend", no_servers)
    folder = tmp_path / "run"
    shutil.copytree(template, folder)
    path = folder / rel
    path.write_bytes(damage(path.read_bytes()))
    code, output = run_cli("sweep", "--resume", str(folder))
    assert code == ExitCode.CONFIG and "Traceback" not in output, output
    where = f"{path}:1: " if rel.endswith(".jsonl") else f"{path}: "
    assert where in output, output


def test_merge_into_a_file_exits_3(template, tmp_path):
    """`--out` naming a file is refused like a folder that holds files, not with a traceback."""
    out = tmp_path / "merged"
    out.write_text("")
    code, output = run_cli("merge", str(template), "--out", str(out))
    assert code == ExitCode.CONFIG and f"--out {out} already exists" in output, output


def _with_injections(template: Path, tmp_path: Path, injections: list) -> tuple[Path, Path]:
    folder = tmp_path / "run"
    shutil.copytree(template, folder)
    (kv_file,) = folder.glob("cells/*/kv/c1-r0.json")
    data = json.loads(kv_file.read_text())
    data["kv"]["injections"] = injections
    kv_file.write_text(json.dumps(data))
    return folder, kv_file


def test_injection_records_in_a_kv_file_read_typed_or_are_refused(template, tmp_path):
    """A kv file's injection entries are the plugin's InjectionRecord: an entry as the plugin has
    always written it reads back typed, and one of another shape is refused naming the file."""
    written = {
        "schema_version": 1,
        "x_request_id": "pd-c1-r0-6a9640bd-q00003",
        "request_id": "cmpl-3-0-aaaaaaaa",
        "kind": "zero-loaded-kv",
        "fraction": 0.5,
        "seed": 7,
        "blocks": [[4, 5]],
        "pid": 123,
        "tp_rank": 0,
        "t": 1.5,
    }
    folder, _ = _with_injections(template, tmp_path / "good", [written])
    (cell,) = check_run(folder).cells
    (record,) = cell.kv[(1, 0)].injections or ()
    assert (record.x_request_id, record.blocks) == (written["x_request_id"], [[4, 5]])

    folder, kv_file = _with_injections(template, tmp_path / "bad", [{"x_request_id": 3}])
    with pytest.raises(ConfigError) as info:
        check_run(folder)
    _refused_naming(info.value, kv_file)
