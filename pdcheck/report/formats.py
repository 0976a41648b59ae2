"""JSON and JUnit renderings of a run, carrying the same verdicts as the markdown report.

All three read their verdicts through `pdcheck.results.summary.cell_outcomes` (the JUnit writer
is the sweep's own), so a cell cannot pass in one format and fail in another.
"""

from __future__ import annotations

import json
from typing import Any

import msgspec

from pdcheck.report.against import compare_rows
from pdcheck.report.junit import render_junit
from pdcheck.report.rows import build_rows
from pdcheck.results.load import RunResults
from pdcheck.results.summary import run_summary

__all__ = ["REPORT_JSON_SCHEMA_VERSION", "render_json", "render_junit", "report_dict"]

REPORT_JSON_SCHEMA_VERSION = 1


def report_dict(run: RunResults, *, against: RunResults | None = None) -> dict[str, Any]:
    """Every result row with its numbers, the counts and exit code, the environment, attribution and the race."""
    summary = run_summary(run)
    rows = build_rows(run)
    data: dict[str, Any] = {
        "schema_version": REPORT_JSON_SCHEMA_VERSION,
        "sweep": msgspec.to_builtins(run.info.sweep),
        "run": str(run.info.root),
        "exit_code": summary.exit_code,
        "counts": msgspec.to_builtins(summary.counts),
        "environment": run.info.environment,
        "results": [row.to_dict() for row in rows],
        "attribution": msgspec.to_builtins(summary.attribution),
        "race": msgspec.to_builtins(run.race),
    }
    if against is not None:
        comparison = compare_rows(rows, build_rows(against))
        data["against"] = {
            "run": str(against.info.root),
            "order": [
                {"cell": cell, "concurrency": c} for cell, c in (r.key for r in comparison.rows)
            ],
            "changed": [{"cell": cell, "concurrency": c} for cell, c in sorted(comparison.changed)],
            "removed": [{"cell": cell, "concurrency": c} for cell, c in comparison.removed],
        }
    return data


def render_json(run: RunResults, *, against: RunResults | None = None) -> str:
    return (
        json.dumps(report_dict(run, against=against), indent=2, sort_keys=False, default=str) + "\n"
    )
