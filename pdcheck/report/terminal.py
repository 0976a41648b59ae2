"""The sweep's closing summary for a terminal: one line per cell and concurrency, read at a glance.

Each line holds the verdict (coloured by what it means for the run), Δ with its interval, n,
the KV tokens the decoders received, and a reason of a few words; the whole reasons are in the
report and the JSON. A line never wraps: where the terminal is too narrow, the end of the line
gives way, marked "…".
"""

from __future__ import annotations

from collections.abc import Sequence

from rich.console import Group
from rich.text import Text

from pdcheck.analysis.verdict import Status
from pdcheck.report.rows import ResultRow, build_rows
from pdcheck.report.sections import count_text, delta_column, delta_text, interval_levels
from pdcheck.results.load import RunResults

__all__ = ["render_summary"]

_STATUS_STYLE = {
    Status.PASS: "green",
    Status.FAIL: "bold red",
    Status.INFRA: "yellow",
    Status.INCONCLUSIVE: "cyan",
}
_GAP = "  "
_INDENT = "  "


def _one_line(*parts: str | tuple[str, str]) -> Text:
    return Text.assemble(*parts, no_wrap=True, overflow="ellipsis")


def _judged_fewer(row: ResultRow) -> bool:
    return row.n is not None and row.planned_n is not None and row.n < row.planned_n


def _n(row: ResultRow) -> str:
    return f"{row.n}/{row.planned_n}" if _judged_fewer(row) else count_text(row.n)


def _summary_lines(rows: Sequence[ResultRow], *, title: str) -> list[Text]:
    """The title, a column header, then per cell its name and one line per concurrency level.

    A legend for n follows when a test judged fewer pairs than it planned.
    """
    levels = interval_levels(rows)
    header = ("c", "verdict", delta_column(levels), "n", "KV tokens")
    fields = [
        (
            f"c{r.concurrency}",
            str(r.verdict),
            delta_text(r, with_level=len(levels) > 1),
            _n(r),
            count_text(r.kv_tokens),
        )
        for r in rows
    ]
    widths = [max(len(f[i]) for f in [header, *fields]) for i in range(len(header))]

    def columns(values: Sequence[str]) -> list[str]:
        c, verdict, delta, n, kv = values
        return [
            c.rjust(widths[0]),
            verdict.ljust(widths[1]),
            delta.ljust(widths[2]),
            n.rjust(widths[3]),
            kv.rjust(widths[4]),
        ]

    lines = [
        _one_line((title, "bold")),
        _one_line((_INDENT + _GAP.join([*columns(header), "why (full: report.md)"]), "dim")),
    ]
    cell = None
    for row, values in zip(rows, fields, strict=True):
        if row.cell != cell:
            cell = row.cell
            canary = any(r.canary for r in rows if r.cell == cell)
            lines.append(_one_line((cell, "bold"), (" · canary" if canary else "", "dim")))
        c, verdict, *numbers = columns(values)
        lines.append(
            _one_line(
                _INDENT + c + _GAP,
                (verdict, _STATUS_STYLE[row.status]),
                _GAP + _GAP.join(numbers) + _GAP,
                row.short_reason,
            )
        )
    if any(_judged_fewer(r) for r in rows):
        legend = "n/N: n of the N planned pairs were judged (early stop or failed requests)"
        lines.append(_one_line((legend, "dim")))
    return lines


def render_summary(run: RunResults) -> Group:
    """The run's results, one line per cell and concurrency, titled with the sweep and its counts."""
    rows = build_rows(run)
    counts = {s: n for s in _STATUS_STYLE if (n := sum(r.status is s for r in rows))}
    title = f"sweep {run.info.sweep.name or run.info.root.name}: {len(rows)} results" + (
        " (" + ", ".join(f"{n} {status}" for status, n in counts.items()) + ")" if counts else ""
    )
    return Group(*_summary_lines(rows, title=title))
