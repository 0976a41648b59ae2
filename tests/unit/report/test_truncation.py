"""Fitting a GitHub comment: detail goes in a fixed order, and no verdict row is ever dropped."""

from __future__ import annotations

import re

import pytest

from pdcheck.report import GITHUB_COMMENT_MAX_CHARS, render_markdown
from pdcheck.results.store import load_run

from .conftest import RACE_FINDINGS, CellPlan
from .mdparse import tables

# Half the results fail (fixes-on regresses at c4 and c8; the canaries are too weak to be flagged
# at c1 and c2), every failure has diverging questions, and completions and logs are long.
PLANS = [
    CellPlan("fixes-on", drops={4: 40, 8: 40}),
    CellPlan("inject-zero", drops={1: 3, 2: 3, 4: 40, 8: 40}),
    CellPlan("fixes-on", model="tiny-granite", drops={4: 40, 8: 40}),
    CellPlan("inject-stale", model="tiny-granite", drops={1: 3, 2: 3, 4: 40, 8: 40}),
]


@pytest.fixture(scope="module")
def big_run(tmp_path_factory):
    from .conftest import write_run

    root = write_run(
        tmp_path_factory.mktemp("big") / "run",
        PLANS,
        n=100,
        concurrency=(1, 2, 4, 8),
        text_len=60,
        log_lines=40,
        race=RACE_FINDINGS,
    )
    return load_run(root)


@pytest.fixture(scope="module")
def full(big_run):
    return render_markdown(big_run, max_chars=10**7)


def _verdicts(text: str) -> set[tuple[str, int, str]]:
    _, body = tables(text)[0]
    return {
        (row[0].split("`")[1], int(row[1]), re.search(r"\*\*([A-Z-]+)\*\*", row[-1]).group(1))
        for row in body
    }


def test_the_full_report_is_untouched_when_it_fits(full):
    """Nothing is shed (and no notice is written) when everything fits."""
    text = full
    assert "Shortened to fit" not in text
    assert text.count("<details>") == 8  # one per failing result


@pytest.fixture(scope="module")
def smallest(big_run):
    """The report at its least detail: every verdict row and nothing optional."""
    return render_markdown(big_run, max_chars=1_000)


@pytest.mark.parametrize("fraction", [0.8, 0.5, 0.2, 0.0])
def test_every_verdict_survives_any_budget(big_run, full, smallest, fraction):
    """Whatever the limit, the text fits it and carries exactly the same verdict rows as the full report."""
    max_chars = len(smallest) + int(fraction * (len(full) - len(smallest)))
    short = render_markdown(big_run, max_chars=max_chars)
    assert len(short) <= max_chars
    assert _verdicts(short) == _verdicts(full)
    assert "Shortened to fit" in short and "report.md" in short


def test_details_blocks_go_first_then_examples(big_run, full):
    """Shedding order: <details> blocks from the last back, then the diverging examples in their one-liners."""
    n_blocks = full.count("<details>")
    # Just under the full size: only the last details block becomes a one-liner.
    one_less = render_markdown(big_run, max_chars=len(full) - 1)
    assert one_less.count("<details>") == n_blocks - 1
    assert "first diverging question" in one_less and "## Accuracy vs concurrency" in one_less


def test_shedding_goes_details_then_examples_then_charts_then_race_then_columns(
    big_run, full, smallest
):
    """Scanning budgets from the smallest report to the full one, detail comes back in reverse shedding order."""
    # Shedding the race tables and the wide columns saves little, so the low budgets are dense.
    budgets = [
        len(smallest) + int(f * (len(full) - len(smallest)))
        for f in (0.0, 0.03, 0.06, 0.1, 0.3, 0.6, 1.0)
    ]
    texts = [render_markdown(big_run, max_chars=b) for b in budgets]
    levels = [
        (
            "<details>" in t,
            "first diverging question" in t.lower(),
            "```mermaid" in t,
            "seeds with findings" in t,
            "p raw / adjusted" in t,
        )
        for t in texts
    ]
    assert levels == sorted(levels), levels  # each level keeps all the detail of every smaller one
    assert levels[0] == (False, False, False, False, False) and levels[-1] == (
        True,
        True,
        True,
        True,
        True,
    )


def test_verdict_rows_stay_even_when_they_alone_exceed_the_limit(full, smallest):
    """A limit too small for the table itself still gets every verdict row (the one allowed overrun)."""
    tiny = smallest
    assert len(tiny) > 1_000
    assert _verdicts(tiny) == _verdicts(full)
    assert tables(tiny)[0][0] == ["Config", "c", "Baseline acc", "PD acc", "Verdict"]


def test_default_budget_is_githubs_comment_limit():
    """GitHub rejects a comment over 65,536 characters."""
    assert GITHUB_COMMENT_MAX_CHARS == 65536
