"""The markdown report's structure, read back with a markdown parser."""

from __future__ import annotations

import re

from pdcheck.report import REPORT_MARKER, render_markdown
from pdcheck.report.sections import cell_text
from pdcheck.results.store import Provenance, RunStore, load_run

from .conftest import SWEEP_FILE, CellPlan
from .mdparse import fences, headings, parse_xychart, tables

PLANS = [
    CellPlan("fixes-on"),
    CellPlan("inject-zero", drops={1: 5, 8: 60}),
    CellPlan("fixes-on", model="tiny-granite"),
    CellPlan("inject-stale", model="tiny-granite", drops={8: 40}),
]
RACE = {
    "status": "pass",
    "reason": "0 findings in 20 seeds",
    "variants": [{"variant": "full-attention", "seeds": 20, "seeds_with_findings": 0}],
}


def test_sections_come_in_the_order_reviewers_read_them(make_run):
    """Marker first, then the overall line, environment, results, charts, race, server logs,
    failures, methodology."""
    text = render_markdown(load_run(make_run(PLANS, race=RACE)))
    assert text.splitlines()[0] == REPORT_MARKER
    assert [h for tag, h in headings(text) if tag == "h2"] == [
        "Environment",
        "Results",
        "Accuracy vs concurrency",
        "Race findings",
        "Server logs",
        "Failures",
        "Methodology",
    ]
    first_paragraph = text.split("\n\n")[2]
    assert first_paragraph.startswith("**Overall: FAIL**") and "\n" not in first_paragraph
    methodology = text.split("## Methodology\n\n", 1)[1].strip().splitlines()
    assert len(methodology) == 3


def test_results_table_has_every_column_and_one_row_per_cell_and_concurrency(make_run):
    """One table, the agreed columns, one row per (cell, concurrency), canaries marked."""
    run = load_run(make_run(PLANS, race=RACE))
    text = render_markdown(run)
    header, body = tables(text)[0]
    assert header == [
        "Config",
        "c",
        "Baseline acc",
        "PD acc",
        "Δ pts (≥89% CI)",
        "p raw / adjusted",
        "Δinvalid pts",
        "Greedy agree",
        "KV tokens",
        "Verdict",
    ]
    assert len(body) == sum(len(c.concurrency) for c in run.cells) == 8
    seen = {(re.search(r"`([^`]+)`", row[0]).group(1), int(row[1])) for row in body}
    assert seen == {(c.name, k) for c in run.cells for k in c.concurrency}
    canary_rows = [row for row in body if "canary" in row[0]]
    assert len(canary_rows) == 4 and all("inject" in row[0] for row in canary_rows)
    regressed = next(row for row in body if "inject-zero" in row[0] and row[1] == "8")
    assert "REGRESSION" in regressed[-1] and "canary flagged" in regressed[-1]
    assert (
        regressed[4].startswith("-30.0 [")
        and regressed[5] == "&lt;0.001 / &lt;0.001"
        and regressed[8] == "8,000"
    )


def test_mermaid_charts_are_well_formed_with_a_line_per_arm(make_run):
    """Per model with several concurrency levels: xychart-beta, both axes, baseline + one line per arm."""
    text = render_markdown(load_run(make_run(PLANS, concurrency=(1, 4, 8))))
    charts = [parse_xychart(body) for body in fences(text, "mermaid")]
    assert len(charts) == 2
    arms = {"tiny-granite": "inject-stale", "tiny-llama": "inject-zero"}
    for chart, (_model, canary_arm) in zip(charts, sorted(arms.items()), strict=False):
        assert chart.x_labels == ["1", "4", "8"]
        low, high = chart.y_range
        assert 0 <= low < high <= 100 and low % 10 == 0 and high % 10 == 0
        # The baseline, then one line per arm of this model.
        assert [name for name, _ in chart.lines] == [
            "baseline (no PD)",
            "PD fixes-on",
            f"PD {canary_arm}",
        ]
        assert all(len(values) == len(chart.x_labels) for _, values in chart.lines)
        assert all(low <= v <= high for _, values in chart.lines for v in values)


def test_no_chart_for_a_single_concurrency_level(make_run):
    """A model run at one concurrency has nothing to plot against concurrency."""
    text = render_markdown(load_run(make_run(PLANS, concurrency=(8,))))
    assert fences(text, "mermaid") == []
    assert "Accuracy vs concurrency" not in [h for _, h in headings(text)]


def test_each_failure_has_a_collapsed_block_with_evidence_and_the_rerun_command(make_run):
    """Failing results get <details>: diverging questions side by side, log tails, the exact rerun."""
    run = load_run(
        make_run(
            [
                CellPlan("fixes-on", drops={8: 60}),
                CellPlan("fixes-on", model="tiny-granite", infra_at=(8,)),
            ]
        )
    )
    text = render_markdown(run)
    blocks = re.findall(r"<details>.*?</details>", text, flags=re.S)
    assert len(blocks) == 2
    regression = next(b for b in blocks if "tiny-llama" in b)
    assert "first divergence at token 3" in regression and "margin 2.00 nats" in regression
    assert tables(regression)[0][0] == ["baseline", "PD"]
    assert "decode line 29" in regression and "logs/decode-0.log" in regression
    for block, cell in zip(blocks, run.cells, strict=False):
        assert f"pdcheck sweep {SWEEP_FILE} --only {cell.name}" in block


def test_environment_says_when_an_arm_disables_a_fix_the_vllm_lacks(make_run):
    """This vLLM has no zeroing fix, so the zeroing-off arm equals the fixes-on arm, and the report says so."""
    text = render_markdown(load_run(make_run([CellPlan("fixes-on"), CellPlan("zeroing-off")])))
    env = text.split("## Environment", 1)[1].split("## Results", 1)[0]
    assert (
        "vLLM: 0.32.0" in env
        and "nixl: 1.5.1" in env
        and "block-reuse present, zeroing absent" in env
    )
    assert "arm `zeroing-off` disables zeroing, which this vLLM lacks" in env
    assert "block-reuse-off" not in env


def test_a_reused_baseline_is_marked(make_run):
    """When a cell's baseline was copied from another cell's run, its row says so."""
    root = make_run([CellPlan("fixes-on"), CellPlan("inject-zero")], concurrency=(1,))
    run = load_run(root)
    store = RunStore(root, Provenance())
    source, target = run.cells
    store.cell(target.dirname).copy_baseline_unit(store.cell(source.dirname), 1, 0)
    _, body = tables(render_markdown(load_run(root)))[0]
    marks = {row[0].split("`")[1]: "(baseline reused)" in row[2] for row in body}
    assert marks == {source.name: False, target.name: True}


def test_model_and_log_text_cannot_break_the_markup(make_run):
    """A log line with a code fence stays inside its block; HTML and pipes in text are escaped."""
    root = make_run([CellPlan("fixes-on", drops={8: 60})])
    run = load_run(root)
    log = root / "cells" / run.cells[0].dirname / "logs" / "decode-0.log"
    log.write_text("before\n```\n<details> | x\n" + "y" * 5000 + "\n")
    text = render_markdown(load_run(root))
    logs = fences(text, "text")
    assert logs[0].splitlines()[:3] == ["before", "```", "<details> | x"]
    assert len(logs[0].splitlines()[3]) <= 240  # a huge line is clipped
    assert text.count("</details>") == 1
    assert cell_text("a|b <b>c</b>\nd") == "a\\|b &lt;b&gt;c&lt;/b&gt;<br>d"


def test_attach_mode_says_the_servers_were_given_by_url(make_run):
    """A run against the user's servers does not pretend to know their vLLM."""
    text = render_markdown(
        load_run(make_run([CellPlan("fixes-on")], environment={"attached": True}))
    )
    env = text.split("## Environment", 1)[1].split("## Results", 1)[0]
    assert "attached by URL" in env and "vLLM:" not in env


def test_race_canary_rows_say_which_levels_are_controls(make_run):
    """fixes-off with async on: c1 is a control that must PASS, c8 a canary expected to be flagged."""
    text = render_markdown(load_run(make_run([CellPlan("fixes-off", drops={8: 60})])))
    _, body = tables(text)[0]
    rows = {int(row[1]): row for row in body}
    assert "canary arm as a control: must PASS" in rows[1][0] and "PASS" in rows[1][-1]
    assert "🐤 canary" in rows[8][0] and "canary flagged" in rows[8][-1]
