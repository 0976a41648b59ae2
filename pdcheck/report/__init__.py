"""Report: markdown, JSON and JUnit renderings of a results folder, read from the store only."""

from pdcheck.report.formats import render_json, render_junit, report_dict
from pdcheck.report.markdown import GITHUB_COMMENT_MAX_CHARS, REPORT_MARKER, render_markdown

__all__ = [
    "GITHUB_COMMENT_MAX_CHARS",
    "REPORT_MARKER",
    "render_json",
    "render_junit",
    "render_markdown",
    "report_dict",
]
