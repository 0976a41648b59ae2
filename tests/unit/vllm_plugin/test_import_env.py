"""The import-environment recorder counts the variables code looks up by name, not the names a
walk over the whole environment (a snapshot, pdcheck's own diff) touches: otherwise whatever the
probing shell happens to set (CI's PDCHECK_GSM8K_DIR) would look like a read by vLLM."""

from __future__ import annotations

import os

from pdcheck._vllm.import_env import EnvironRecorder


def test_named_lookups_are_reads_and_walks_are_not(monkeypatch):
    """`get`, `[]` and `in` by name are recorded; `dict(environ)`, `.items()` and `.copy()` are
    not."""
    monkeypatch.setenv("PDCHECK_PROBE_WALKED", "1")
    monkeypatch.setenv("PDCHECK_PROBE_NAMED", "1")
    recorder = EnvironRecorder(os.environ)
    dict(recorder)
    list(recorder.items())
    recorder.copy()
    assert recorder.read == set()
    recorder.get("PDCHECK_PROBE_NAMED")
    assert "PDCHECK_PROBE_MISSING" not in recorder
    assert recorder.read == {"PDCHECK_PROBE_NAMED", "PDCHECK_PROBE_MISSING"}
