"""Activation markers and the injection log: complete JSON, one line per record, even from many processes."""

from __future__ import annotations

import json
import os

import pytest

from pdcheck.vllm_plugin import marker as marker_module
from pdcheck.vllm_plugin.marker import (
    KV_LOAD_HOOK_WITH_KV_CACHES,
    SCHEDULER_BUILT,
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
