"""JUnit XML for CI: one testcase per cell and concurrency; failures carry the verdict reason."""

from __future__ import annotations

import xml.etree.ElementTree as ET

from pdcheck.analysis.verdict import Status
from pdcheck.results.store import RunResults
from pdcheck.results.summary import cell_outcomes


def render_junit(results: RunResults) -> str:
    """A <testsuite> named after the sweep; fail → <failure>, infra → <error>, inconclusive → <skipped>."""
    sweep = results.info.sweep.name or "pdcheck"
    suite = ET.Element("testsuite", name=f"pdcheck.{sweep}")
    # Which pdcheck judged the run, as every report says (the run's own stamp, not this process's).
    properties = ET.SubElement(suite, "properties")
    ET.SubElement(
        properties,
        "property",
        name="pdcheck_version",
        value=str(results.info.environment.get("pdcheck_version") or "unknown"),
    )
    tests = failures = errors = skipped = 0
    for cell in results.cells:
        for concurrency, outcome in cell_outcomes(cell):
            tests += 1
            case = ET.SubElement(
                suite, "testcase", classname=f"{sweep}.{cell.name}", name=f"c{concurrency}"
            )
            message = f"{outcome.verdict}: {outcome.reason}"
            if outcome.status is Status.FAIL:
                failures += 1
                ET.SubElement(case, "failure", message=message, type=outcome.verdict).text = message
            elif outcome.status is Status.INFRA:
                errors += 1
                ET.SubElement(case, "error", message=message, type=outcome.verdict).text = message
            elif outcome.status is Status.INCONCLUSIVE:
                skipped += 1
                ET.SubElement(case, "skipped", message=message)
            else:
                ET.SubElement(case, "system-out").text = message
    if results.race is not None:
        tests += 1
        case = ET.SubElement(suite, "testcase", classname=f"{sweep}.race", name="harness")
        status = results.race.status
        message = results.race.reason or str(status)
        if status is Status.FAIL:
            failures += 1
            ET.SubElement(case, "failure", message=message, type="RACE").text = message
        elif status is not Status.PASS:
            errors += 1
            ET.SubElement(case, "error", message=message, type="HARNESS").text = message
    suite.set("tests", str(tests))
    suite.set("failures", str(failures))
    suite.set("errors", str(errors))
    suite.set("skipped", str(skipped))
    ET.indent(suite)
    return (
        '<?xml version="1.0" encoding="utf-8"?>\n' + ET.tostring(suite, encoding="unicode") + "\n"
    )
