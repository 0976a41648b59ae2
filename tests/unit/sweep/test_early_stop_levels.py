"""Early stop ends a cell's higher levels only on a measured drop, never on KV evidence alone.

A level flagged from transfer evidence or the digests says the KV went wrong at c1, but the
race behind it (a freed block reused by another request) bites at the higher levels, so those
must run for the report to show what it did (issue 41). The engine's judging is wrapped to give
c1 each kind of flag; the fake servers answer PD as the baseline does.
"""

from __future__ import annotations

import dataclasses

import pytest

from pdcheck.analysis.verdict import Basis, Verdict
from pdcheck.results import load_run
from pdcheck.sweep import engine as engine_module
from pdcheck.sweep.judging import JudgedLevel
from tests.unit.sweep.test_cli_sweep import CLEAN, _sweep


@pytest.mark.parametrize(
    ("basis", "verdict", "higher_runs"),
    [
        (Basis.TRANSFER, Verdict.SUSPECT, True),
        (Basis.KV_DIGESTS, Verdict.REGRESSION, True),
        (Basis.ACCURACY, Verdict.REGRESSION, False),
    ],
)
def test_only_an_accuracy_flag_skips_the_higher_levels(
    sweep_file, servers, tmp_path, monkeypatch, basis, verdict, higher_runs
):
    real = engine_module.judge_level

    def flag_c1(cell, cs, concurrency, **kw) -> JudgedLevel:
        judged = real(cell, cs, concurrency, **kw)
        if concurrency != 1:
            return judged
        flagged = dataclasses.replace(judged.verdict, verdict=verdict, basis=basis)
        return JudgedLevel(flagged, judged.outcome)

    monkeypatch.setattr(engine_module, "judge_level", flag_c1)
    base, good, _ = servers
    _sweep(sweep_file, tmp_path / "r", CLEAN, good.url, base.url, "--early-stop")
    cell = load_run(tmp_path / "r").cells[0]
    assert (cell.unit("pd", 4, 0) is not None) is higher_runs
    assert (cell.verdicts[4].carried_from == 1) is not higher_runs
