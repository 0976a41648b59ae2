"""Read a rendered report back with markdown-it-py: headings, tables and mermaid blocks."""

from __future__ import annotations

import re
from dataclasses import dataclass

from markdown_it import MarkdownIt

_PARSER = MarkdownIt("commonmark").enable("table")
NUMBER = r"[+-]?(?:\d+(?:\.\d+)?|\.\d+)"
QUOTED = r'"[^"\n]*"'


def tokens(text: str):
    return _PARSER.parse(text)


def headings(text: str) -> list[tuple[str, str]]:
    """(tag, text) of every heading, in order."""
    toks = tokens(text)
    return [(t.tag, toks[i + 1].content) for i, t in enumerate(toks) if t.type == "heading_open"]


def tables(text: str) -> list[tuple[list[str], list[list[str]]]]:
    """Every table as (header cells, body rows), cell text as markdown-it sees it."""
    out, header, body, row, section = [], [], [], [], None
    for t in tokens(text):
        if t.type == "table_open":
            header, body = [], []
        elif t.type in ("thead_open", "tbody_open"):
            section = t.type
        elif t.type == "tr_open":
            row = []
        elif t.type == "inline" and section is not None:
            row.append(t.content)
        elif t.type == "tr_close":
            (header.extend(row) if section == "thead_open" else body.append(row))
        elif t.type == "table_close":
            out.append((header, body))
            section = None
    return out


def fences(text: str, info: str) -> list[str]:
    return [t.content for t in tokens(text) if t.type == "fence" and t.info.strip() == info]


@dataclass(frozen=True)
class XyChart:
    x_labels: list[str]
    y_range: tuple[float, float]
    lines: list[tuple[str, list[float]]]


def parse_xychart(body: str) -> XyChart:
    """Parse the xychart-beta subset the report writes, failing on anything malformed."""
    lines = [line.strip() for line in body.strip().splitlines()]
    assert lines[0] == "xychart-beta", lines[0]
    x_labels, y_range, series = None, None, []
    for line in lines[1:]:
        if m := re.fullmatch(rf"title {QUOTED}", line):
            continue
        if m := re.fullmatch(rf"x-axis {QUOTED} \[((?:{QUOTED})(?:, {QUOTED})*)\]", line):
            x_labels = re.findall(r'"([^"]*)"', m.group(1))
        elif m := re.fullmatch(rf"y-axis {QUOTED} ({NUMBER}) --> ({NUMBER})", line):
            y_range = (float(m.group(1)), float(m.group(2)))
        elif m := re.fullmatch(rf'line "([^"\n]*)" \[({NUMBER}(?:, {NUMBER})*)\]', line):
            series.append((m.group(1), [float(v) for v in m.group(2).split(", ")]))
        else:
            raise AssertionError(f"not xychart-beta syntax: {line!r}")
    assert x_labels is not None and y_range is not None, "x-axis and y-axis are both required"
    return XyChart(x_labels, y_range, series)
