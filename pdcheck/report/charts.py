"""Accuracy against concurrency, one chart per model that ran more than one concurrency level.

Each chart has the no-PD baseline as its first line, then one line per arm (cell) of the
model. A series with a missing point cannot be drawn (xychart has no gaps); it is named
under the chart instead of being padded with a made-up value.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from pdcheck.report.mermaid import ChartLine, render_xychart
from pdcheck.report.rows import ResultRow

__all__ = ["ModelChart", "accuracy_charts", "y_range"]


@dataclass(frozen=True)
class ModelChart:
    model: str
    concurrencies: tuple[int, ...]
    lines: tuple[ChartLine, ...]
    left_out: tuple[str, ...]  # series with a missing point

    def to_markdown(self) -> str:
        body = render_xychart(
            title=f"{self.model}: GSM8K accuracy vs concurrency",
            x_title="concurrency",
            x_labels=[str(c) for c in self.concurrencies],
            y_title="accuracy (%)",
            y_range=y_range(self.lines),
            lines=self.lines,
        )
        legend = (
            "Lines, in order: "
            + ", ".join(f"{i + 1}. {line.name}" for i, line in enumerate(self.lines))
            + "."
        )
        if self.left_out:
            legend += (
                " Not drawn (a concurrency level has no result): " + ", ".join(self.left_out) + "."
            )
        return f"```mermaid\n{body}\n```\n\n{legend}"


def y_range(lines: Sequence[ChartLine]) -> tuple[float, float]:
    """The data's range widened to whole tens: a 0-100 axis would flatten a 3-point drop."""
    values = [v for line in lines for v in line.values]
    low = max(0.0, math.floor(min(values) / 10) * 10)
    high = min(100.0, math.ceil(max(values) / 10) * 10)
    return (low, high) if high > low else (max(0.0, low - 10), min(100.0, high + 10))


def _labels(cells: Sequence[str], model: str) -> dict[str, str]:
    """Short names: the parts of the cell names that differ between this model's cells."""
    parts = {cell: cell.removeprefix(model + "-").split("-") for cell in cells}
    lengths = {len(p) for p in parts.values()}
    if len(cells) < 2 or len(lengths) != 1:
        return {cell: "-".join(p) for cell, p in parts.items()}
    width = lengths.pop()
    varying = [i for i in range(width) if len({p[i] for p in parts.values()}) > 1]
    return {cell: "-".join(p[i] for i in varying) for cell, p in parts.items()}


def _series(
    rows: Sequence[ResultRow],
    concurrencies: Sequence[int],
    value: Callable[[ResultRow], float | None],
) -> tuple[float, ...] | None:
    by_c = {r.concurrency: value(r) for r in rows}
    values = [by_c.get(c) for c in concurrencies]
    present = [v for v in values if v is not None]
    return tuple(100 * v for v in present) if len(present) == len(values) else None


def accuracy_charts(rows: Sequence[ResultRow]) -> list[ModelChart]:
    """One chart per model with more than one concurrency level, in the order models first appear."""
    charts = []
    for model in dict.fromkeys(r.model for r in rows):
        model_rows = [r for r in rows if r.model == model]
        concurrencies = tuple(sorted({r.concurrency for r in model_rows}))
        if len(concurrencies) < 2:
            continue
        cells = list(dict.fromkeys(r.cell for r in model_rows))
        labels = _labels(cells, model)
        lines, left_out = [], []
        for cell in cells:
            baseline = _series(
                [r for r in model_rows if r.cell == cell],
                concurrencies,
                lambda r: r.baseline_accuracy,
            )
            if baseline is not None:
                lines.append(ChartLine("baseline (no PD)", baseline))
                break
        for cell in cells:
            values = _series(
                [r for r in model_rows if r.cell == cell], concurrencies, lambda r: r.pd_accuracy
            )
            if values is None:
                left_out.append(labels[cell] or cell)
            else:
                lines.append(ChartLine(f"PD {labels[cell] or cell}", values))
        if any(line.name.startswith("PD ") for line in lines):
            charts.append(ModelChart(model, concurrencies, tuple(lines), tuple(left_out)))
    return charts
