"""The xychart-beta writer only emits what mermaid's grammar accepts."""

from __future__ import annotations

import pytest

from pdcheck.report.mermaid import ChartLine, render_xychart

from .mdparse import parse_xychart


def test_quotes_in_names_cannot_break_the_chart():
    """A double quote would end a mermaid string early; it is replaced, and values stay plain decimals."""
    body = render_xychart(
        title='say "hi"',
        x_title="c",
        x_labels=['1"', "2"],
        y_title="y",
        y_range=(0, 100),
        lines=[ChartLine('arm "x"', (12.345, 1e-9))],
    )
    chart = parse_xychart(body)
    assert chart.x_labels == ["1'", "2"]
    assert chart.lines == [("arm 'x'", [12.3, 0.0])]


def test_a_line_must_have_one_value_per_x_label():
    """xychart cannot draw a gap, so a short series is refused rather than drawn wrong."""
    with pytest.raises(ValueError, match="2 values for 3 x labels"):
        render_xychart(
            title="t",
            x_title="c",
            x_labels=["1", "2", "3"],
            y_title="y",
            y_range=(0, 1),
            lines=[ChartLine("a", (1.0, 2.0))],
        )


def test_the_y_axis_fits_the_data_in_whole_tens():
    """Accuracies of 83-86% get an 80-90 axis, not 0-100 where a 3-point drop is invisible."""
    from pdcheck.report.charts import y_range

    assert y_range([ChartLine("a", (83.5, 86.2))]) == (80.0, 90.0)
    assert y_range([ChartLine("a", (100.0, 100.0))]) == (90.0, 100.0)
    assert y_range([ChartLine("a", (0.0, 0.0)), ChartLine("b", (40.0, 12.0))]) == (0.0, 40.0)
