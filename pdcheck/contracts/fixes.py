"""The two race fixes and what pdcheck says of each in a vLLM: present (with its form), absent or unknown.

The status crosses process boundaries (the `_vllm.fixes` program's answer, activation markers,
race summaries, run records), so it is defined once here.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

FIXES: tuple[str, ...] = ("block-reuse", "zeroing")

FixState = Literal["present", "absent", "unknown"]


@dataclass(frozen=True)
class FixStatus:
    fix: str
    state: FixState
    form: str | None = None  # the fix's shape in this vLLM when present, e.g. "skip-zero-block-ids"

    def describe(self) -> str:
        """`present (skip-zero-block-ids)`, `absent` or `unknown`: how every rendering names it."""
        return f"present ({self.form})" if self.state == "present" and self.form else self.state

    def to_dict(self) -> dict:
        return {"state": self.state, "form": self.form}

    @classmethod
    def from_dict(cls, fix: str, data: dict | bool | None) -> FixStatus:
        """Read a status; a bare bool or null is an older record's `fixes_present` value."""
        if isinstance(data, dict):
            return cls(fix, data["state"], data.get("form"))
        if data is None:
            return cls(fix, "unknown")
        return cls(fix, "present" if data else "absent")


def unknown_statuses() -> dict[str, FixStatus]:
    return {fix: FixStatus(fix, "unknown") for fix in FIXES}


def statuses_from_record(raw: dict | None) -> dict[str, FixStatus]:
    """The fixes of an environment record or probe answer, older records' bool values included."""
    return {fix: FixStatus.from_dict(fix, value) for fix, value in (raw or {}).items()}


def describe_fixes(statuses: Mapping[str, FixStatus]) -> str:
    """`block-reuse present (deferred-free), zeroing absent`: one line for reports and summaries."""
    return ", ".join(f"{fix} {s.describe()}" for fix, s in statuses.items()) or "unknown"


def describe_statuses(raw: dict | None) -> str:
    """`describe_fixes` of a record's or probe answer's raw fixes."""
    return describe_fixes(statuses_from_record(raw))
