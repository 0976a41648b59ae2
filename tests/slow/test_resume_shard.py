"""Resume after kill -9, and shard/merge round trips, against fake OpenAI servers in attach mode."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections import Counter

from pdcheck.cli import main
from pdcheck.results import load_run
from tests.fakes.openai_server import FakeOpenAIServer, wait_until
from tests.unit.sweep.conftest import LIMIT, answering

CLEAN = "fake-p1x1-d1x1-async-fixes-on"


def _lines(path):
    return path.read_text().splitlines() if path.is_file() else []


def _question_ids(server):
    ids = [{k.lower(): v for k, v in h.items()}.get("x-request-id", "") for h in server.headers]
    return [i for i in ids if not i.endswith("preflight")]


def test_kill_9_mid_unit_then_resume_loses_nothing_and_duplicates_nothing(
    sweep_file, gold_by_question, tmp_path
):
    """A sweep killed mid-PD-unit resumes: finished units are not re-asked, each record appears once, verdicts as usual."""
    out = tmp_path / "r"
    with (
        FakeOpenAIServer(answering(gold_by_question), delay_s=0.05) as base,
        # PD's c1 runs beside the baseline's c4 (one level behind): the slower PD is still
        # mid-unit well after the baseline's last unit has finished.
        FakeOpenAIServer(answering(gold_by_question), delay_s=0.2) as pd,
    ):
        argv = [
            sys.executable,
            "-m",
            "pdcheck",
            "sweep",
            str(sweep_file),
            "--out",
            str(out),
            "--only",
            CLEAN,
            "--baseline-url",
            base.url,
            "--pd-url",
            pd.url,
        ]
        proc = subprocess.Popen(
            argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
        )
        try:
            assert wait_until(
                lambda: (
                    len(_lines(next(iter(out.glob("cells/*/pd/c1/r0/records.jsonl")), out / "x")))
                    >= 3
                    and any(out.glob("cells/*/baseline/c4/r0/summary.json"))
                ),
                timeout_s=60,
            ), "the sweep never reached the PD unit with its baseline done"
        finally:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        (cell_dir,) = out.glob("cells/*")
        pd_c1 = cell_dir / "pd/c1/r0"
        before = _lines(pd_c1 / "records.jsonl")
        assert not (pd_c1 / "summary.json").exists() and len(before) < LIMIT
        assert (cell_dir / "baseline/c4/r0/summary.json").is_file()
        asked_before = Counter(_question_ids(base))

        assert (
            main(["sweep", "--resume", str(out), "--baseline-url", base.url, "--pd-url", pd.url])
            == 0
        )

        assert Counter(_question_ids(base)) == asked_before, (
            "finished baseline units must not be asked again"
        )
        # Questions recorded before the kill are not asked again (only those in flight may be).
        asked_pd = Counter(_question_ids(pd))
        recorded_first = {
            f"pd-c1-r0-{cell_dir.name.rsplit('--', 1)[1]}-q{json.loads(line)['index']:05d}"
            for line in before
        }
        assert {rid: asked_pd[rid] for rid in recorded_first} == dict.fromkeys(recorded_first, 1)
    run = load_run(out)
    for unit in run.cells[0].units:
        indices = [r.index for r in unit.records()]
        assert sorted(indices) == list(range(LIMIT)), f"{unit.side} c{unit.concurrency}: {indices}"
    assert [v.verdict.verdict for v in run.cells[0].verdicts.values()] == ["PASS", "PASS"]
    assert json.loads((out / "run.json").read_text())["resumed"]


def test_shard_then_merge_equals_the_whole(sweep_file, servers, tmp_path):
    """Shards split cells disjointly by id, cover every cell, and merge back into one run with every verdict."""
    from pdcheck.config import expand_cells, load_sweep
    from pdcheck.sweep.run import shard_cells

    cells = expand_cells(load_sweep(sweep_file))
    shards = [shard_cells(cells, (i, 3)) for i in (1, 2, 3)]
    assert sorted(c.id for s in shards for c in s) == sorted(c.id for c in cells)

    base, good, bad = servers
    # Attach mode tests one cell per run; each cell's shard is run against the servers it needs.
    folders = []
    for i, shard in enumerate(shards, start=1):
        for cell in shard:
            pd_url = bad.url if cell.arm.canary else good.url
            folder = tmp_path / f"shard{i}-{cell.arm.name}"
            assert (
                main(
                    [
                        "sweep",
                        str(sweep_file),
                        "--out",
                        str(folder),
                        "--shard",
                        f"{i}/3",
                        "--only",
                        cell.name,
                        "--baseline-url",
                        base.url,
                        "--pd-url",
                        pd_url,
                    ]
                )
                == 0
            )
            folders.append(str(folder))
    assert main(["merge", *folders, "--out", str(tmp_path / "merged")]) == 0
    merged = load_run(tmp_path / "merged")
    assert sorted(c.id for c in merged.cells) == sorted(c.id for c in cells)
    assert all(len(c.verdicts) == 2 for c in merged.cells)
    summary = json.loads((tmp_path / "merged" / "summary.json").read_text())
    assert summary["exit_code"] == 0 and len(summary["cells"]) == len(cells)
    # Merging the same shard twice is refused: a cell may come from one folder only.
    assert main(["merge", folders[0], folders[0], "--out", str(tmp_path / "twice")]) == 3
