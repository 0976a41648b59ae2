"""Mermaid `xychart-beta` line charts, in the subset of the grammar GitHub renders.

The grammar (mermaid's `xychart.jison`): `xychart-beta`, then `title "..."`,
`x-axis "title" [label, ...]`, `y-axis "title" min --> max`, and one `line "name" [v, ...]`
per series. Quoted strings cannot contain a double quote, and numbers must match
`[+-]?(\\d+(\\.\\d+)?|\\.\\d+)`: no exponent, no NaN. Every line must have one value per
x label, so a series with a missing point is left out by the caller, never padded.
GitHub draws no legend for named lines, so the report states the line order in text.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["ChartLine", "render_xychart"]


@dataclass(frozen=True)
class ChartLine:
    """One series: a name and one value per x label."""

    name: str
    values: tuple[float, ...]


def _quoted(text: str) -> str:
    # The lexer ends a string at the next double quote and has no escape for it.
    return '"' + text.replace('"', "'").replace("\n", " ") + '"'


def _number(value: float) -> str:
    return f"{value:.1f}"


def render_xychart(
    *,
    title: str,
    x_title: str,
    x_labels: Sequence[str],
    y_title: str,
    y_range: tuple[float, float],
    lines: Sequence[ChartLine],
) -> str:
    """The body of a ```` ```mermaid ```` block (without the fences)."""
    if not x_labels:
        raise ValueError("an xychart needs at least one x label")
    if not lines:
        raise ValueError("an xychart needs at least one line")
    for line in lines:
        if len(line.values) != len(x_labels):
            raise ValueError(
                f"line {line.name!r} has {len(line.values)} values for {len(x_labels)} x labels; "
                "leave out a series with missing points"
            )
    low, high = y_range
    out = [
        "xychart-beta",
        f"    title {_quoted(title)}",
        f"    x-axis {_quoted(x_title)} [{', '.join(_quoted(x) for x in x_labels)}]",
        f"    y-axis {_quoted(y_title)} {_number(low)} --> {_number(high)}",
    ]
    out += [
        f"    line {_quoted(line.name)} [{', '.join(_number(v) for v in line.values)}]"
        for line in lines
    ]
    return "\n".join(out)
