"""Activation markers and the injection log: complete JSON, one line per record, even from many processes."""

from __future__ import annotations

import json
import multiprocessing
import os
import subprocess
import sys
import textwrap

import pytest

from pdcheck.vllm_plugin import marker as marker_module
from pdcheck.vllm_plugin.marker import (
    KV_LOAD_HOOK_WITH_KV_CACHES,
    SCHEDULER_BUILT,
    InjectionLog,
    InjectionRecord,
    record_in_marker,
    write_activation_marker,
)


@pytest.fixture(autouse=True)
def _forget_the_activation(monkeypatch):
    """A marker written here would otherwise follow every later fork of this test process."""
    monkeypatch.setattr(marker_module, "_activation", None)


def test_activation_marker_has_the_contract_fields(tmp_path):
    """`activation-<pid>.json` carries pid, process name, vLLM version, switches, fixes present."""
    path = write_activation_marker(
        tmp_path / "new",
        vllm_version="0.32.0",
        switches=["inject=stale-kv:0.5:seed=1"],
        fixes_present={"block-reuse": True, "zeroing": False},
    )
    assert path.name == f"activation-{os.getpid()}.json"
    marker = json.loads(path.read_text())
    assert marker["pid"] == os.getpid() and marker["process_name"] == "MainProcess"
    assert marker["vllm_version"] == "0.32.0" and marker["switches"] == [
        "inject=stale-kv:0.5:seed=1"
    ]
    assert marker["fixes_present"] == {"block-reuse": True, "zeroing": False}
    assert marker["schema_version"] == 1
    assert [p.name for p in path.parent.iterdir()] == [path.name]  # no temporary left behind


def test_the_marker_records_what_its_process_did(tmp_path):
    """`did` starts empty and gains each event once, with its facts, rewritten atomically."""
    path = write_activation_marker(tmp_path, vllm_version="0.32.0", switches=[], fixes_present=None)
    assert json.loads(path.read_text())["did"] == []
    record_in_marker(tmp_path, SCHEDULER_BUILT, async_scheduling=False)
    record_in_marker(tmp_path, KV_LOAD_HOOK_WITH_KV_CACHES, tp_rank=0)
    record_in_marker(tmp_path, KV_LOAD_HOOK_WITH_KV_CACHES, tp_rank=0)
    marker = json.loads(path.read_text())
    assert marker["did"] == [SCHEDULER_BUILT, KV_LOAD_HOOK_WITH_KV_CACHES]
    assert (marker["async_scheduling"], marker["tp_rank"]) == (False, 0)
    assert [p.name for p in tmp_path.iterdir()] == [path.name]


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
