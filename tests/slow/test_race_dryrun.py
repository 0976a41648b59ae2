"""The race harness as a sweep subprocess, --dry-run output, empty shards and the default sweep file.

(Moved from tests/unit/sweep: most tests start a stand-in race subprocess, the vLLM probe of a dry
run, or a whole sweep with its race-fix probe.)
"""

from __future__ import annotations

import json
import stat
import textwrap

import pytest

from pdcheck.cli import main
from pdcheck.config.schema import RaceSettings
from pdcheck.sweep.race import race_argv, run_race_subprocess
from pdcheck.sweep.run import default_sweep_file

# Autouse here as in tests/unit/sweep: a dry run of `pr` sizes its hub models' weights from the Hub.
from tests.unit.sweep.conftest import unreachable_hub  # noqa: F401


def _fake_python(tmp_path, *, code: int, result: dict | None):
    """A stand-in interpreter: writes `result` to the --out path and exits with `code`."""
    script = tmp_path / "python"
    script.write_text(
        textwrap.dedent(f"""\
        #!/bin/sh
        while [ "$1" != "--out" ]; do shift; done
        {"echo '" + json.dumps(result) + "' > $2" if result is not None else "echo 'vllm: not importable' >&2"}
        exit {code}
        """)
    )
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    return str(script)


def test_race_argv_passes_the_sweep_race_settings():
    """The subprocess gets seeds, requests, every variant and an --out path."""
    argv = race_argv(
        RaceSettings(seeds=3, requests=50, variants=("hybrid",)), python="py", json_path="/x.json"
    )
    assert argv == [
        "py",
        "-m",
        "pdcheck",
        "race",
        "--seeds",
        "3",
        "--requests",
        "50",
        "--variant",
        "hybrid",
        "--out",
        "/x.json",
    ]


@pytest.mark.parametrize(("code", "status"), [(0, "pass"), (1, "fail"), (2, "infra")])
def test_race_exit_code_is_the_status_and_json_is_kept(tmp_path, code, status):
    """0 clean → pass, 1 findings → fail (with the variants that found something), 2 → infra with the log tail."""
    result = (
        {"variants": [{"variant": "hybrid", "seeds": 4, "seeds_with_findings": 2}]}
        if code < 2
        else None
    )
    summary = run_race_subprocess(
        RaceSettings(), python=_fake_python(tmp_path, code=code, result=result), out_dir=tmp_path
    )
    assert summary.status == status and summary.exit_code == code
    if code == 1:
        assert "hybrid: 2/4 seeds" in summary.reason
    if code == 2:
        assert "not importable" in summary.reason and summary.result is None


def test_race_findings_fail_the_sweep_through_the_summary(tmp_path):
    """A race summary with status fail makes the sweep exit 1 and adds a junit failure."""
    from pdcheck.analysis.verdict import Status
    from pdcheck.report.junit import render_junit
    from pdcheck.results import load_run
    from pdcheck.results.schema import RaceOutcome, SweepInfo
    from pdcheck.results.store import Provenance, create_run
    from pdcheck.results.summary import summarize

    store = create_run(
        tmp_path / "r",
        provenance=Provenance(),
        sweep=SweepInfo(name="s", file="s.yaml", sha256="x"),
        environment={},
    )
    store.write_race_summary(
        RaceOutcome(status=Status.FAIL, reason="findings in hybrid", exit_code=1)
    )
    run = load_run(store.root)
    assert summarize(run).exit_code == 1
    assert 'type="RACE"' in render_junit(run)


def test_dry_run_prints_every_server_and_starts_nothing(sweep_file, tmp_path, capsys):
    """--dry-run lists each server start with its exact argv and env, writes no folder, exits 0."""
    out = tmp_path / "never"
    assert main(["sweep", str(sweep_file), "--dry-run", "--no-check-argv", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "fake-p1x1-d1x1-async-inject-zero" in text and "canary=True" in text
    assert "PDCHECK_INJECT=zero-loaded-kv:0.5" in text, "the decoder's env must show the injection"
    # 2 cells × (prefill, decode) and the baseline they share, started once
    assert text.count("serve /nonexistent/fake-model") == 5
    assert "# baseline: the one of fake-p1x1-d1x1-async-fixes-on (same baseline key)" in text
    assert "pdcheck proxy --prefill" in text
    assert not out.exists()


def test_dry_run_plans_a_gpu_sweep_for_gpus_this_machine_lacks(tmp_path, capsys, monkeypatch):
    """`--dry-run --gpus N` plans the shipped GPU sweep on a machine without GPUs; --gpus alone is refused."""
    monkeypatch.setenv("PATH", str(tmp_path))  # no nvidia-smi
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    out = tmp_path / "never"
    assert (
        main(["sweep", "pr", "--dry-run", "--gpus", "4", "--no-check-argv", "--out", str(out)]) == 0
    )
    text = capsys.readouterr().out
    assert "4 cells" in text and "(gpu)" in text and "CUDA_VISIBLE_DEVICES=2 " in text
    assert main(["sweep", "pr", "--dry-run", "--no-check-argv", "--out", str(out)]) == 3, (
        "0 GPUs cannot fit pr"
    )
    assert main(["sweep", "pr", "--gpus", "4", "--out", str(out)]) == 3
    assert not out.exists()


def test_an_empty_shard_is_a_clean_empty_run(sweep_file, tmp_path):
    """With more shards than cells some shard is empty: it finishes with no cells and exit 0, and merges."""
    from pdcheck.config import expand_cells, load_sweep
    from pdcheck.sweep.run import shard_cells

    cells = expand_cells(load_sweep(sweep_file))
    empty = next(i for i in range(1, 9) if not shard_cells(cells, (i, 8)))
    assert (
        main(["sweep", str(sweep_file), "--shard", f"{empty}/8", "--out", str(tmp_path / "r")]) == 0
    )
    summary = json.loads((tmp_path / "r" / "summary.json").read_text())
    assert summary["cells"] == [] and summary["exit_code"] == 0


def test_default_sweep_is_gpu_with_gpus_else_cpu_smoke():
    """No FILE: default-gpu when GPUs exist, cpu-smoke otherwise."""
    assert default_sweep_file(has_gpus=True) == "default-gpu"
    assert default_sweep_file(has_gpus=False) == "cpu-smoke"


def test_dry_run_and_validate_say_per_level_whether_a_canary_is_expected(
    sweep_file, tmp_path, capsys, monkeypatch
):
    """A race arm with async on: c1 a control that must PASS, c4 expected to flag; validate agrees."""
    from pdcheck.cli._common import console

    monkeypatch.setattr(console, "width", 200)  # the table, unwrapped
    sweep_file.write_text(
        sweep_file.read_text().replace("arms: [fixes-on, inject-zero]", "arms: [fixes-off]")
    )
    assert (
        main(
            [
                "sweep",
                str(sweep_file),
                "--dry-run",
                "--no-check-argv",
                "--out",
                str(tmp_path / "never"),
            ]
        )
        == 0
    )
    text = capsys.readouterr().out
    assert "# c1: must PASS (control: at concurrency 1" in text
    assert "# c4: expected to flag (async scheduling on" in text
    assert "--async-scheduling" in text
    assert main(["validate", str(sweep_file)]) == 0
    assert "flag c4; PASS c1" in capsys.readouterr().out
