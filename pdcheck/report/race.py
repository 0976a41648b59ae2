"""The race-findings section: harness results, trace hazards, attribution, injection precision.

The sweep stores the race harness's JSON as it came from `pdcheck race --json` (under
`race/summary.json`); this section shows its status and, per variant, what it found.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from pdcheck.report.sections import table

__all__ = ["race_section"]


def _scalar_table(items: Sequence[Mapping[str, Any]]) -> str:
    """A table of a list of flat records: one column per scalar key, in first-seen order."""
    columns = list(dict.fromkeys(k for item in items for k, v in item.items() if not isinstance(v, (dict, list))))
    return table(columns, [[_text(item.get(c)) for c in columns] for item in items])


def _text(value: Any) -> str:
    if value is None:
        return "–"
    if isinstance(value, float):
        return f"{value:.3g}"
    return str(value)


def race_section(race: Mapping[str, Any] | None, *, evidence: bool = True) -> str:
    """Status and reason always; per-variant tables and finding examples when `evidence`."""
    if race is None:
        return "The race harness did not run in this sweep (no `race:` section); run `pdcheck race`."
    lines = [f"Harness status: **{race.get('status', '?')}**" + (f" — {race['reason']}" if race.get("reason") else "")]
    if not evidence:
        return "\n".join(lines)
    for key, value in race.items():
        if isinstance(value, list) and value and all(isinstance(v, Mapping) for v in value):
            lines += ["", f"**{key.replace('_', ' ')}**", "", _scalar_table(value)]
    return "\n".join(lines)
