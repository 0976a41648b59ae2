"""JSON, JUnit and markdown carry the same verdicts; the CLI renders each and exits with the run's code."""

from __future__ import annotations

import json
import re
import xml.etree.ElementTree as ET

from click.testing import CliRunner

from pdcheck.cli import main
from pdcheck.cli.report import report
from pdcheck.report import render_json, render_junit, render_markdown
from pdcheck.results.store import load_run

from .conftest import CellPlan
from .mdparse import tables

PLANS = [
    CellPlan("fixes-on"),
    CellPlan("inject-zero", drops={8: 60}),
    CellPlan("fixes-on", model="tiny-granite", drops={1: 40}, infra_at=(8,)),
]


def _markdown_verdicts(text):
    _, body = tables(text)[0]
    return {
        (row[0].split("`")[1], int(row[1])): re.search(r"\*\*([A-Z-]+)\*\*", row[-1]).group(1)
        for row in body
    }


def _junit_verdicts(xml):
    out = {}
    for case in ET.fromstring(xml).iter("testcase"):
        if case.get("name") == "harness":
            continue
        cell = case.get("classname").split(".", 1)[1]
        node = next(iter(case), None)
        out[(cell, int(case.get("name")[1:]))] = (node.get("message") or node.text).split(":")[0]
    return out


def test_markdown_json_and_junit_agree_on_every_verdict(make_run):
    """The same (cell, concurrency) → verdict map comes out of all three formats."""
    run = load_run(make_run(PLANS))
    from_json = {
        (r["cell"], r["concurrency"]): r["verdict"] for r in json.loads(render_json(run))["results"]
    }
    assert (
        from_json == _markdown_verdicts(render_markdown(run)) == _junit_verdicts(render_junit(run))
    )
    assert set(from_json.values()) == {"PASS", "REGRESSION", "INFRA-ERROR"}


def test_cli_writes_each_format_and_exits_with_the_runs_code(make_run, tmp_path):
    """`pdcheck report DIR --format F --out FILE` writes F and exits 1 because a cell regressed."""
    root = make_run(PLANS)
    for fmt in ("md", "json", "junit"):
        out = tmp_path / f"report.{fmt}"
        result = CliRunner().invoke(report, [str(root), "--format", fmt, "--out", str(out)])
        assert result.exit_code == 1, result.output
        assert out.stat().st_size > 0
    assert json.loads((tmp_path / "report.json").read_text())["exit_code"] == 1


def test_cli_prints_markdown_and_exits_0_for_a_clean_run(make_run):
    """A run where everything passed prints the report to stdout and exits 0."""
    root = make_run([CellPlan("fixes-on"), CellPlan("inject-zero", drops={1: 60, 8: 60})])
    result = CliRunner().invoke(report, [str(root)])
    assert result.exit_code == 0, result.output
    assert result.output.startswith("<!-- pdcheck-report -->\n")


def test_not_a_results_folder_is_a_config_error(tmp_path, capsys):
    """A folder without run.json exits 3 and says what to give instead; nothing is written."""
    out = tmp_path / "r.md"
    assert main(["report", str(tmp_path), "--out", str(out)]) == 3
    assert "no run.json" in capsys.readouterr().err
    assert not out.exists()


def test_json_against_lists_the_changed_results_first(make_run):
    """The JSON rendering carries the --against order and the changed keys too."""
    old = load_run(make_run([CellPlan("fixes-on")]))
    new = load_run(make_run([CellPlan("fixes-on", drops={8: 60})]))
    data = json.loads(render_json(new, against=old))["against"]
    assert data["order"][0] == {"cell": new.cells[0].name, "concurrency": 8}
    assert data["changed"] == [{"cell": new.cells[0].name, "concurrency": 8}]


def test_cli_against_puts_the_changed_result_first(make_run):
    """`pdcheck report NEW --against OLD` leads the table with the result that changed."""
    old = make_run([CellPlan("fixes-on"), CellPlan("fixes-on", model="tiny-granite")])
    new = make_run(
        [CellPlan("fixes-on"), CellPlan("fixes-on", model="tiny-granite", drops={8: 60})]
    )
    result = CliRunner().invoke(report, [str(new), "--against", str(old)])
    assert result.exit_code == 1, result.output
    header, body = tables(result.output)[0]
    assert header[-1] == "Before" and "tiny-granite" in body[0][0] and body[0][1] == "8"


def test_every_format_names_the_pdcheck_that_judged_the_run(make_run):
    """Markdown, JSON and JUnit each carry the pdcheck version stamped into the run."""
    run = load_run(make_run(PLANS))
    version = run.info.environment["pdcheck_version"]
    assert version
    assert f"- pdcheck: {version}" in render_markdown(run)
    assert json.loads(render_json(run))["environment"]["pdcheck_version"] == version
    prop = ET.fromstring(render_junit(run)).find("properties/property[@name='pdcheck_version']")
    assert prop is not None and prop.get("value") == version
