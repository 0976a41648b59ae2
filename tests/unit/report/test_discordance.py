"""The report prints each clean level's measured discordance beside what its design tolerates."""

from __future__ import annotations

from dataclasses import replace

from pdcheck.analysis.verdict import Status, Verdict
from pdcheck.report.rows import ResultRow
from pdcheck.report.sections import discordance_lines


def _row(cell: str, c: int, d: float, limit: float, *, canary: bool = False) -> ResultRow:
    row = ResultRow(
        cell=cell,
        cell_id="x",
        dirname=cell,
        model="m",
        arm="a",
        concurrency=c,
        canary=canary,
        status=Status.PASS,
        verdict=Verdict.PASS,
        reason="",
    )
    return replace(row, discordance=d, tolerated_discordance=limit)


def test_levels_past_their_limit_get_a_line_with_the_fix():
    """One summary line with the measured and tolerated ranges of the clean levels, then one
    line per clean level whose d is past its design's limit; canaries are left out."""
    lines = discordance_lines(
        [
            _row("clean", 1, 0.02, 0.084),
            _row("clean", 8, 0.12, 0.084),
            _row("canary", 1, 0.5, 0.084, canary=True),
        ]
    )
    assert lines[0].startswith("Discordance d") and "2.0–12.0%" in lines[0] and "8.4%" in lines[0]
    assert lines[1:] == [
        "- `clean` c8: d = 12.0% is past the 8.4% its design tolerates: ask more questions or "
        "repeats, widen the margin, or use the bit-exact mode."
    ]


def test_no_clean_level_with_numbers_prints_nothing():
    assert discordance_lines([_row("canary", 1, 0.5, 0.1, canary=True)]) == []
