"""One decision (issue 40): `analysis.verdict.decide` alone gives a level its verdict, so
`pdcheck compare` and the sweep's judging cannot disagree on the same evidence."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from click.testing import CliRunner

import pdcheck
from pdcheck.cli import cli
from pdcheck.results.load import load_run
from tests.unit.report.conftest import CellPlan, write_run

# A verdict word used as a value (assigned, returned, passed), not compared with `is`/`==`/`in`.
_ASSIGNED = re.compile(
    r"(?<!is )(?<!is not )(?<!== )(?<!!= )(?<!in \()(?<!in {)"
    r"\bVerdict\.(PASS|REGRESSION|SUSPECT|INCONCLUSIVE|INFRA_ERROR|NO_DROP_SHOWN)\b"
)


@pytest.mark.parametrize("drops", [0, 12, 40])
def test_compare_and_the_sweep_give_the_same_verdict_on_the_same_records(tmp_path, drops):
    """The records a sweep judged, given to `pdcheck compare` with the sweep's margin: the same
    verdict, Δ, interval, p-values and reason (a lone clean level: a family of one either way)."""
    root = write_run(tmp_path / "run", [CellPlan("fixes-on", drops={1: drops})], concurrency=(1,))
    (cell,) = load_run(root).cells
    stored = cell.verdicts[1].verdict
    unit = root / "cells" / cell.dirname
    base, pd = (unit / side / "c1" / "r0" / "records.jsonl" for side in ("baseline", "pd"))
    result = CliRunner().invoke(
        cli, ["compare", str(base), str(pd), "--margin-pts", "5", "--json", "--allow-inconclusive"]
    )
    assert result.exit_code in (0, 1), result.output
    got = json.loads(result.output)["verdict"]
    assert got["verdict"] == stored.verdict.value
    for key in ("delta_pts", "ci_low_pts", "ci_high_pts", "p_value", "adjusted_p_value"):
        assert got[key] == pytest.approx(getattr(stored, key)), key
    assert got["reason"] == stored.reason


def test_verdict_words_are_assigned_only_where_verdicts_are_decided():
    """Outside analysis/verdict.py no module builds a CellVerdict or uses a verdict word as a
    value: judging loads and records, the CLI and the report only read."""
    root = Path(pdcheck.__file__).parent
    offenders = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        if rel == "analysis/verdict.py":
            continue
        for i, line in enumerate(path.read_text().splitlines(), 1):
            if "CellVerdict(" in line or _ASSIGNED.search(line):
                offenders.append(f"{rel}:{i}: {line.strip()}")
    assert not offenders, "\n".join(offenders)
