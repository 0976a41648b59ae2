"""`pdcheck race` end to end in-process: exit codes, JSON output, and the env switch meaning the flag."""

from __future__ import annotations

import json

import pytest

from pdcheck.cli import main
from pdcheck.errors import VllmIncompatible
from pdcheck.race import RaceSummary

pytestmark = pytest.mark.vllm

ARGS = ["race", "--seeds", "1", "--requests", "40", "--variant", "attention"]


def test_clean_run_exits_0_and_writes_the_summary_json(adapter, tmp_path):
    """Shipped vLLM: exit 0, and --json holds a RaceSummary (schema_version, no findings) the sweep can load."""
    out = tmp_path / "race.json"
    assert main([*ARGS, "--out", str(out)]) == 0
    data = json.loads(out.read_text())
    assert data["schema_version"] == 1 and data["has_findings"] is False
    assert RaceSummary.from_dict(data).variants[0].seeds == 1


def test_disable_fix_flag_and_env_variable_both_exit_1(adapter, monkeypatch, tmp_path):
    """--disable-fix block-reuse and PDCHECK_DISABLE_FIXES=block-reuse mean the same: findings, exit 1."""
    assert main([*ARGS, "--disable-fix", "block-reuse"]) == 1
    monkeypatch.setenv("PDCHECK_DISABLE_FIXES", "block-reuse")
    out = tmp_path / "env.json"
    assert main([*ARGS, "--out", str(out)]) == 1
    assert json.loads(out.read_text())["disabled_fixes"] == ["block-reuse"]


def test_incompatible_vllm_exits_2_naming_what_is_missing(adapter, monkeypatch, capsys):
    """The harness cannot run on a vLLM without the internals it needs: exit 2, never a clean pass."""

    def incompatible():
        raise VllmIncompatible(
            "9.9.9", missing=["vllm.v1.core.sched.scheduler:Scheduler._free_request_blocks"]
        )

    monkeypatch.setattr(adapter, "check_internals", incompatible)
    assert main(ARGS) == 2
    assert "_free_request_blocks" in capsys.readouterr().err


def test_bad_options_exit_3_before_importing_anything(adapter):
    """An unknown variant or fix name is a config error (exit 3)."""
    assert main(["race", "--variant", "nope"]) == 3
    assert main(["race", "--disable-fix", "everything"]) == 3
