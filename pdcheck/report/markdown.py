"""The markdown report, ready to paste into a PR or post as a comment.

Sections, in order: the overall verdict line, the environment, the results table (one row per
cell and concurrency), accuracy-vs-concurrency charts, race findings, per-failure evidence in
collapsed blocks, and the methodology. The report must fit a GitHub comment, so when it is too
long it sheds detail in a fixed order (details blocks from the last one back, then the
diverging examples, then the charts, then the race evidence, then the wide table columns) and
says so, with a pointer to the full report. A verdict row is never dropped.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, replace

from pdcheck.config import AnalysisPolicy
from pdcheck.report.against import Comparison, compare_rows
from pdcheck.report.boundaries import boundary_section
from pdcheck.report.charts import accuracy_charts
from pdcheck.report.details import diverging_questions, log_tails, rerun_command
from pdcheck.report.exactness import exactness_section
from pdcheck.report.kv_integrity import kv_integrity_section
from pdcheck.report.prefix_cache import prefix_cache_section
from pdcheck.report.queueing import queueing_section
from pdcheck.report.race import race_sections
from pdcheck.report.rows import ResultRow, build_rows
from pdcheck.report.sections import (
    discordance_lines,
    environment_section,
    failure_details,
    failure_line,
    interval_levels,
    methodology_section,
    overall_line,
    results_table,
    tuning_lines,
)
from pdcheck.report.server_logs import server_logs_section
from pdcheck.results.load import RunResults
from pdcheck.results.schema import RaceOutcome
from pdcheck.results.summary import run_summary

__all__ = ["GITHUB_COMMENT_MAX_CHARS", "REPORT_MARKER", "render_markdown"]

logger = logging.getLogger(__name__)

GITHUB_COMMENT_MAX_CHARS = 65536
# The first line of every report: CI finds its previous PR comment by it and updates it.
REPORT_MARKER = "<!-- pdcheck-report -->"


@dataclass(frozen=True)
class _Failure:
    full: str  # the <details> block
    line: str  # one line with the rerun command and the first diverging question
    bare_line: str  # one line with the rerun command only


@dataclass(frozen=True)
class _Detail:
    """How much of the report to keep; each field is one step of shedding."""

    full_failures: int  # how many failures keep their <details> block (the first ones)
    examples: bool = True
    charts: bool = True
    race_evidence: bool = True
    wide_table: bool = True


def _failures(run: RunResults, rows: Sequence[ResultRow]) -> list[_Failure]:
    cells = {c.name: c for c in run.cells}
    out = []
    for row in rows:
        if not row.failing:
            continue
        cell = cells[row.cell]
        questions = diverging_questions(cell, row.concurrency)
        rerun = rerun_command(run, cell)
        out.append(
            _Failure(
                full=failure_details(
                    row, questions=questions, tails=log_tails(run, cell), rerun=rerun
                ),
                line=failure_line(row, rerun=rerun, first=questions[0] if questions else None),
                bare_line=failure_line(row, rerun=rerun, first=None),
            )
        )
    return out


def _policy(run: RunResults) -> AnalysisPolicy | None:
    return next((c.spec.analysis for c in run.cells if c.spec is not None), None)


def _dataset_sha(run: RunResults) -> str | None:
    if run.info.provenance.dataset_sha256:
        return run.info.provenance.dataset_sha256
    shas = {u.summary.dataset_sha256 for c in run.cells for u in c.units if u.summary}
    return ", ".join(sorted(shas)) or None


def _arm_fixes(run: RunResults) -> dict[str, tuple[str, ...]]:
    arms: dict[str, tuple[str, ...]] = {}
    for cell in run.cells:
        if cell.spec is not None and cell.spec.arm.disable_fixes:
            arms[cell.spec.arm.name] = tuple(cell.spec.arm.disable_fixes)
    return arms


def _races(run: RunResults) -> dict[str | None, RaceOutcome]:
    """The harness's outcome per environment name (None: pdcheck's own python)."""
    races = {race.environment: race for race in run.environment_races}
    return races | ({None: run.race} if run.race is not None else {})


def _sync_cells(run: RunResults) -> dict[str | None, list[str]]:
    """The cells with async scheduling off, per environment name (None: pdcheck's own vLLM)."""
    out: dict[str | None, list[str]] = {}
    for cell in run.cells:
        if cell.spec is not None and not cell.spec.async_scheduling:
            env = cell.spec.environment.name if cell.spec.environment else None
            out.setdefault(env, []).append(cell.name)
    return out


def _against_note(against: RunResults, comparison: Comparison) -> str:
    vllm = (against.info.environment.get("vllm") or {}).get("vllm_version") or "unknown vLLM"
    text = (
        f"Compared against `{against.info.root.name}` ({vllm}): {len(comparison.changed)} "
        "result(s) changed verdict or PD accuracy and come first."
    )
    if comparison.removed:
        text += (
            " Not in this run: "
            + ", ".join(f"`{cell}` c{c}" for cell, c in comparison.removed)
            + "."
        )
    return text


def _shed_notice(
    detail: _Detail, n_failures: int, *, has_charts: bool, max_chars: int, run: RunResults
) -> str | None:
    dropped = []
    if detail.full_failures < n_failures:
        dropped.append(
            f"{n_failures - detail.full_failures} of {n_failures} failure details blocks"
        )
    if not detail.examples and n_failures:
        dropped.append("the diverging examples")
    if not detail.charts and has_charts:
        dropped.append("the charts")
    if not detail.race_evidence and run.race is not None:
        dropped.append("the race evidence tables")
    if not detail.wide_table:
        dropped.append("the statistics columns of the table")
    if not dropped:
        return None
    return (
        f"> ✂️ Shortened to fit a GitHub comment ({max_chars:,} characters): dropped {', '.join(dropped)}. "
        f"Every verdict is above. The full report is `report.md` in the results folder "
        f"`{run.info.root.name}` (the run's uploaded artifact); `pdcheck report {run.info.root.name}` "
        "renders it again."
    )


def _shedding_steps(n_failures: int):
    """Ever less detailed versions of the report, in the order the module docstring gives."""
    detail = _Detail(full_failures=n_failures)
    yield detail
    for kept in range(n_failures - 1, -1, -1):
        detail = replace(detail, full_failures=kept)
        yield detail
    for step in (
        {"examples": False},
        {"charts": False},
        {"race_evidence": False},
        {"wide_table": False},
    ):
        detail = replace(detail, **step)
        yield detail


def render_markdown(
    run: RunResults, *, against: RunResults | None = None, max_chars: int = GITHUB_COMMENT_MAX_CHARS
) -> str:
    """The whole report as markdown, at most `max_chars` characters whenever the verdict rows fit."""
    rows = build_rows(run)
    comparison = compare_rows(rows, build_rows(against)) if against is not None else None
    ordered = list(comparison.rows) if comparison else rows
    policy = _policy(run)
    failures = _failures(run, ordered)
    charts = [f"### {chart.model}\n\n{chart.to_markdown()}" for chart in accuracy_charts(rows)]
    mde = [r.mde_pts for r in rows if r.mde_pts is not None]
    discordance = discordance_lines(rows)
    head = [
        REPORT_MARKER,
        f"# pdcheck: {run.info.sweep.name or run.info.root.name}",
        overall_line(run_summary(run), rows),
        "## Environment",
        environment_section(
            run.info.environment,
            dataset_sha256=_dataset_sha(run),
            arm_fixes=_arm_fixes(run),
            tuning=tuning_lines(
                server
                for cell in run.cells
                for topology in cell.servers
                for server in topology.servers
            ),
            races=_races(run),
            sync_cells=_sync_cells(run),
        ),
        "## Results",
    ]
    if comparison is not None and against is not None:
        head.append(_against_note(against, comparison))
    race_full, race_compact = race_sections(run)
    kv_integrity = kv_integrity_section(run)
    exactness = exactness_section(run)
    prefix_cache = prefix_cache_section(run)
    boundaries = boundary_section(run)
    queueing = queueing_section(run)
    server_logs = server_logs_section(run)
    methodology = methodology_section(
        alpha=policy.alpha if policy else None,
        margin_pts=policy.margin_pts if policy else None,
        tie_epsilon_nats=policy.tie_epsilon_nats if policy else None,
        mde_pts=mde,
        interval_levels=interval_levels(rows),
    )

    def compose(detail: _Detail) -> str:
        parts = [
            *head,
            results_table(
                ordered,
                before=comparison.before if comparison else None,
                compact=not detail.wide_table,
            ),
        ]
        if discordance:
            parts.append("\n".join(discordance))
        if charts:
            parts.append("## Accuracy vs concurrency")
            parts += charts if detail.charts else ["Charts left out to fit; see the full report."]
        parts += ["## Race findings", race_full if detail.race_evidence else race_compact]
        if kv_integrity is not None:
            parts += ["## KV integrity", kv_integrity]
        if exactness is not None:
            parts += ["## Bit-exact judging", exactness]
        if prefix_cache is not None:
            parts += ["## Prefix caching", prefix_cache]
        if boundaries is not None:
            parts += ["## Block-boundary coverage", boundaries]
        if queueing is not None:
            parts += ["## Concurrency above what the servers run at once", queueing]
        if server_logs is not None:
            parts += ["## Server logs", server_logs]
        if failures:
            parts.append("## Failures")
            parts += [f.full for f in failures[: detail.full_failures]]
            rest = failures[detail.full_failures :]
            if rest:
                parts.append("\n".join(f.line if detail.examples else f.bare_line for f in rest))
        parts += ["## Methodology", methodology]
        notice = _shed_notice(
            detail, len(failures), has_charts=bool(charts), max_chars=max_chars, run=run
        )
        if notice:
            parts.append(notice)
        return "\n\n".join(parts) + "\n"

    text = ""
    for detail in _shedding_steps(len(failures)):
        text = compose(detail)
        if len(text) <= max_chars:
            return text
    logger.warning(
        "the report's verdict rows alone need %d characters (limit %d); keeping every row",
        len(text),
        max_chars,
    )
    return text
