"""The plugin's files are read back through the one schema the plugin writes them with: a
marker or digest line the plugin writes decodes, and one of another shape is refused or left
out, never read half-way."""

from __future__ import annotations

import json

import msgspec
import pytest

from pdcheck.contracts.plugin_files import SCHEDULER_BUILT, read_activation_markers
from pdcheck.vllm_plugin import marker as marker_module
from pdcheck.vllm_plugin.marker import record_in_marker, write_activation_marker


@pytest.fixture(autouse=True)
def _forget_the_activation(monkeypatch):
    """A marker written here would otherwise follow every later fork of this test process."""
    monkeypatch.setattr(marker_module, "_activation", None)


def test_a_marker_the_plugin_wrote_reads_back_with_its_facts(tmp_path):
    """What the writer recorded (switches, fixes, what the process did and the async scheduling
    it resolved) is what serving reads."""
    write_activation_marker(
        tmp_path, vllm_version="0.32.0", switches=["disable-fix=zeroing"], fixes_present=None
    )
    record_in_marker(tmp_path, SCHEDULER_BUILT, async_scheduling=True)
    (marker,) = read_activation_markers(tmp_path)
    assert marker.switches == ["disable-fix=zeroing"] and marker.did == [SCHEDULER_BUILT]
    assert marker.async_scheduling is True and marker.vllm_version == "0.32.0"


def test_a_file_that_is_not_a_marker_is_left_out(tmp_path):
    """A marker-named file of another shape (no `did`), or not JSON, is not read as a marker
    with its facts guessed; the arm's check then names the marker it misses."""
    (tmp_path / "activation-1.json").write_text(json.dumps({"schema_version": 1, "pid": 1}))
    (tmp_path / "activation-2.json").write_text("{not json")
    assert read_activation_markers(tmp_path) == []


def test_the_plugin_refuses_to_record_a_fact_of_the_wrong_type(tmp_path):
    """A fact whose type the schema does not allow fails in the process that writes it."""
    write_activation_marker(tmp_path, vllm_version="0.32.0", switches=[], fixes_present=None)
    with pytest.raises(msgspec.ValidationError, match="tp_rank"):
        record_in_marker(tmp_path, SCHEDULER_BUILT, tp_rank="zero")
