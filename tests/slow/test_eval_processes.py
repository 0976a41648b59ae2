"""Evals in processes of their own: a kill mid-write or mid-run loses no whole record, and an
offline machine without the dataset fails at once.

(Moved from tests/unit/evals: each test starts a process.)
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time

from pdcheck.evals import read_records
from tests.unit.evals.conftest import rerun_asks_exactly_the_missing


def test_sigkill_after_writes_loses_no_record(tmp_path):
    """A process killed with SIGKILL right after writing (no close, no fsync) leaves every line intact."""
    out = tmp_path / "r.jsonl"
    code = (
        "import os, signal, sys\n"
        "from pdcheck.evals.records import QuestionRecord, RecordWriter\n"
        f"w = RecordWriter({str(out)!r}, fsync_interval_s=3600)\n"
        "for i in range(500):\n"
        "    w.write(QuestionRecord(index=i, prompt_sha256='x', gold='1', ok=True, completion='c' * 300))\n"
        "os.kill(os.getpid(), signal.SIGKILL)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    assert [r.index for r in read_records(out)] == list(range(500))


def test_sigkill_mid_run_then_resume_asks_exactly_the_unwritten_questions(tmp_path):
    """A run killed mid-way keeps whole records only; the rerun asks exactly the questions without one."""
    out = tmp_path / "r.jsonl"
    code = (
        "import os, signal\n"
        "from pdcheck.config import EvalSettings\n"
        "from pdcheck.evals import run_eval\n"
        "from tests.fakes.openai_server import FakeOpenAIServer\n"
        "from tests.unit.evals.conftest import make_task\n"
        "seen = []\n"
        "def on_record(record):\n"
        "    seen.append(record.index)\n"
        "    if len(seen) == 25:\n"
        "        os.kill(os.getpid(), signal.SIGKILL)\n"
        "with FakeOpenAIServer(delay_s=0.005) as server:\n"
        f"    run_eval(server.url, make_task(n_test=80), settings=EvalSettings(shots=1), concurrency=8, out_path={str(out)!r},\n"
        "             model='m', on_record=on_record)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    kept = [r.index for r in read_records(out)]
    assert len(kept) >= 25, "a record is written before on_record hears of it"
    assert len(kept) < 80 and len(set(kept)) == len(kept)
    rerun_asks_exactly_the_missing(out, 80, concurrency=8)


def test_offline_without_cache_fails_fast_with_how_to(tmp_path):
    """No folder, HF_HUB_OFFLINE=1 and an empty hub cache: DatasetError at once, not a hang."""
    code = (
        "from pdcheck.config import EvalSettings\n"
        "from pdcheck.evals.dataset import load_task\n"
        "from pdcheck.errors import DatasetError\n"
        "try:\n"
        "    load_task(EvalSettings())\n"
        "except DatasetError as exc:\n"
        "    print('DatasetError:', exc)\n"
    )
    env = {
        "PATH": "/usr/bin:/bin",
        "HOME": str(tmp_path),
        "HF_HOME": str(tmp_path / "hf"),
        "HF_HUB_OFFLINE": "1",
        "HF_DATASETS_OFFLINE": "1",
    }
    start = time.monotonic()
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120
    )
    assert time.monotonic() - start < 60
    assert out.stdout.startswith("DatasetError:"), out.stderr[-2000:]
    assert "PDCHECK_GSM8K_DIR" in out.stdout and "--dataset" in out.stdout
