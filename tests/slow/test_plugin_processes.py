"""The plugin in processes of its own: a forked EngineCore's marker and trace, and several
processes (TP ranks) appending to one injection log.

(Moved from tests/unit/vllm_plugin: each test starts processes.)
"""

from __future__ import annotations

import json
import multiprocessing
import os
import subprocess
import sys
import textwrap

from pdcheck.vllm_plugin.marker import SCHEDULER_BUILT, InjectionLog, InjectionRecord
from pdcheck.vllm_plugin.trace_format import read_trace_dir

_FORKING_PROCESS = textwrap.dedent(
    """
    import multiprocessing, os, sys
    from pathlib import Path
    from pdcheck.vllm_plugin.marker import SCHEDULER_BUILT, record_in_marker, write_activation_marker

    plugin_dir = Path(sys.argv[1])

    def engine_core():
        record_in_marker(plugin_dir, SCHEDULER_BUILT, async_scheduling=True)

    write_activation_marker(
        plugin_dir, vllm_version="0.32.0", switches=["disable-fix=zeroing"], fixes_present=None
    )
    child = multiprocessing.get_context("fork").Process(target=engine_core, name="EngineCore")
    child.start()
    child.join(60)
    print(os.getpid(), child.pid, child.exitcode)
    """
)


def test_a_forked_child_writes_its_own_marker_with_the_inherited_switches(tmp_path):
    """vLLM forks its EngineCore on CUDA (pdcheck does on CPU at TP 1): the child inherits the
    patches but never runs register(), so without a marker of its own it could record nothing."""
    out = subprocess.run(
        [sys.executable, "-c", _FORKING_PROCESS, str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    parent_pid, child_pid, exitcode = map(int, out.stdout.split())
    assert exitcode == 0
    markers = {
        m["pid"]: m for m in (json.loads(p.read_text()) for p in tmp_path.glob("activation-*.json"))
    }
    assert set(markers) == {parent_pid, child_pid}
    parent, child = markers[parent_pid], markers[child_pid]
    assert parent["did"] == [] and "forked_from" not in parent
    assert child["forked_from"] == parent_pid and child["switches"] == ["disable-fix=zeroing"]
    assert (child["did"], child["async_scheduling"]) == ([SCHEDULER_BUILT], True)
    assert child["process_name"] == "EngineCore"  # named by multiprocessing after the fork


def _record(i: int) -> InjectionRecord:
    return InjectionRecord(
        x_request_id=f"pd-q{i:05d}",
        request_id=f"cmpl-pd-q{i:05d}-0-abcdef01",
        kind="zero-loaded-kv",
        fraction=0.5,
        seed=1,
        blocks=[[i, i + 1] * 50],
        pid=os.getpid(),
        tp_rank=0,
        t=1.0,
    )


def _append_many(plugin_dir, start):
    log = InjectionLog(plugin_dir)
    for i in range(start, start + 200):
        log.append(_record(i))


def test_concurrent_appends_never_interleave(tmp_path):
    """Four processes (like four TP ranks) appending at once leave 800 whole, parseable lines."""
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_append_many, args=(tmp_path, k * 1000)) for k in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    lines = (tmp_path / "injections.jsonl").read_text().splitlines()
    records = [json.loads(line) for line in lines]
    assert len(records) == 800
    assert {r["x_request_id"] for r in records} == {
        f"pd-q{k * 1000 + i:05d}" for k in range(4) for i in range(200)
    }
    assert set(records[0]) == {
        "schema_version",
        "x_request_id",
        "request_id",
        "kind",
        "fraction",
        "seed",
        "blocks",
        "pid",
        "tp_rank",
        "t",
    }


_FORKED_SCHEDULER = """
import contextlib, multiprocessing, sys
from types import SimpleNamespace
from pdcheck._vllm.records import FreeRecord
from pdcheck.vllm_plugin import trace_recorder

recorders = []

@contextlib.contextmanager
def recording(directory):  # the real recorder, without vLLM's hooks: the child calls it directly
    recorders.append(trace_recorder.TraceRecorder(directory))
    yield recorders[-1]

trace_recorder.recording = recording
trace_recorder.install_from_env({"PDCHECK_TRACE_DIR": sys.argv[1]})

def engine_core():
    (recorder,) = recorders
    recorder.on_start([SimpleNamespace(kind="attention", block_size=16)], True, True)
    for i in range(500):
        recorder.on_free(FreeRecord(f"r{i}", False, i))

child = multiprocessing.get_context("fork").Process(target=engine_core)
child.start()
child.join(60)
print(child.pid, child.exitcode)
"""


def test_a_forked_scheduler_process_writes_its_whole_trace(tmp_path):
    """vLLM's forked EngineCore ends with os._exit, which skips atexit: its queued events still reach the file."""
    out = subprocess.run(
        [sys.executable, "-c", _FORKED_SCHEDULER, str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    child_pid, exitcode = map(int, out.stdout.split())
    assert exitcode == 0
    assert len(read_trace_dir(str(tmp_path))) == 1
    events = [
        json.loads(line)
        for line in (tmp_path / f"trace-{child_pid}.jsonl").read_text().splitlines()
    ]
    assert [e["e"] for e in events] == ["start"] + ["free"] * 500
