"""GitHub's published schemas accept every workflow, action.yml and the Dependabot config
(check-jsonschema, run as a child process, so this lives in the slow tier)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
WORKFLOWS = ROOT / ".github" / "workflows"


def test_workflows_and_action_match_the_github_schemas():
    """Every workflow, action.yml and the Dependabot config validate against GitHub's published
    schemas (vendored by check-jsonschema)."""
    workflows = sorted(str(p) for p in WORKFLOWS.glob("*.yml"))
    for schema, files in (
        ("vendor.github-workflows", workflows),
        ("vendor.github-actions", [str(ROOT / "action.yml")]),
        ("vendor.dependabot", [str(ROOT / ".github" / "dependabot.yml")]),
    ):
        proc = subprocess.run(
            [sys.executable, "-m", "check_jsonschema", "--builtin-schema", schema, *files],
            capture_output=True,
            text=True,
        )
        assert proc.returncode == 0, proc.stdout + proc.stderr
