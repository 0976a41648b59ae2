"""register() costs nothing when unused and fails start-up, before importing vLLM, on a bad variable.

Each check runs register() in a fresh interpreter (moved from tests/unit: it starts a process).
"""

from __future__ import annotations

import subprocess
import sys

_PROBE = """
import os, sys
from pdcheck.vllm_plugin import register
try:
    register()
    register()
    outcome = "ok"
except Exception as exc:
    outcome = type(exc).__name__ + ": " + str(exc)
heavy = sorted(m for m in sys.modules if m.split(".")[0] in ("vllm", "torch", "nixl"))
print(repr((outcome, heavy)))
"""


def _probe(env: dict[str, str]) -> tuple[str, list[str]]:
    base = {
        k: v for k, v in __import__("os").environ.items() if not k.startswith(("PDCHECK_", "VLLM_"))
    }
    out = subprocess.run(
        [sys.executable, "-c", _PROBE],
        env={**base, **env},
        capture_output=True,
        text=True,
        check=True,
    )
    return eval(out.stdout.strip().splitlines()[-1])


def test_no_plugin_variable_is_a_fast_no_op(tmp_path):
    """Without plugin variables (other PDCHECK_* ones don't count) register() imports nothing heavy and writes nothing."""
    outcome, heavy = _probe(
        {"PDCHECK_CACHE_DIR": str(tmp_path), "PDCHECK_GSM8K_DIR": str(tmp_path)}
    )
    assert outcome == "ok" and heavy == []
    assert list(tmp_path.iterdir()) == []


def test_bad_injection_fails_registration_before_vllm_is_imported(tmp_path):
    """`PDCHECK_INJECT=melt:2` raises ConfigError from register() (which kills vLLM start-up)."""
    outcome, heavy = _probe({"PDCHECK_INJECT": "melt:2", "PDCHECK_PLUGIN_DIR": str(tmp_path)})
    assert outcome.startswith("ConfigError: PDCHECK_INJECT='melt:2'")
    assert "zero-loaded-kv, stale-kv" in outcome
    assert heavy == []
    assert list(tmp_path.iterdir()) == []  # no marker: the plugin did not activate
