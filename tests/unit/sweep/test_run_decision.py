"""The run's decision in a sweep: Holm across the clean tests at finish, and the INCONCLUSIVE gate."""

from __future__ import annotations

import json

from pdcheck.analysis.power import SIZING_TOLERANCE, tolerated_discordance
from pdcheck.analysis.transfer_evidence import PrefillerLogEvents
from pdcheck.analysis.verdict import Verdict
from pdcheck.cli import main
from pdcheck.config import SweepSpec, expand_cells, load_sweep
from pdcheck.contracts.server_records import KvTransferMetrics
from pdcheck.results import load_run
from pdcheck.results.store import CellStore, open_run
from pdcheck.sweep.judging import (
    apply_family,
    clean_level_designs,
    clean_tests,
    judge_level,
)
from tests.unit.report.conftest import CellPlan, write_run
from tests.unit.sweep.test_cli_sweep import CLEAN, _sweep


def test_finish_applies_holm_across_the_clean_tests(tmp_path):
    """A 6-question drop in 200 (p = 0.016) fails a level judged alone, but not one of 4 clean
    tests: at finish the level is re-judged with Holm's adjusted p, 4 × 0.016."""
    plans = [
        CellPlan("fixes-on", model="tiny-llama", drops={1: 6}),
        CellPlan("fixes-on", model="tiny-granite"),
    ]
    root = write_run(tmp_path / "run", plans)
    run = load_run(root)
    cell = next(c for c in run.cells if c.name.startswith("tiny-llama"))
    v = cell.verdicts[1].verdict
    assert v.family_size == 4 and v.p_value is not None
    assert v.adjusted_p_value is not None and abs(v.adjusted_p_value - 4 * v.p_value) < 1e-12
    assert v.verdict is not Verdict.REGRESSION, v.reason
    # The same level judged alone (a family of one) is a REGRESSION.
    spec = cell.spec
    assert spec is not None and cell.provenance is not None
    alone = judge_level(spec, CellStore(root, cell.dirname, cell.provenance), 1)
    assert alone.outcome.verdict is Verdict.REGRESSION


def test_the_family_is_the_levels_expected_clean():
    """Clean arms' levels are in the family; canaries' are not; a race arm's levels where its race
    cannot fire (async off, concurrency 1) are clean tests."""
    spec = SweepSpec(
        name="f",
        models=[{"name": "m", "path": "fixture:tiny-llama"}],
        matrix={
            "arms": ["fixes-on", "inject-zero", "fixes-off"],
            "async_scheduling": [True],
            "concurrency": [1, 8],
        },
    )
    assert clean_tests(expand_cells(spec)) == 2 + 0 + 1


def test_an_underpowered_clean_sweep_fails_unless_allowed(sweep_file, servers, tmp_path):
    """16 questions cannot show a 3-point drop: INCONCLUSIVE, which fails the sweep (exit 1),
    unless the sweep says analysis.allow_inconclusive: true (exit 0)."""
    base, good, _ = servers
    sweep_file.write_text(sweep_file.read_text().replace("margin_pts: 40", "margin_pts: 2"))
    assert _sweep(sweep_file, tmp_path / "strict", CLEAN, good.url, base.url) == 1
    summary = json.loads((tmp_path / "strict" / "summary.json").read_text())
    result = summary["cells"][0]["results"][0]
    assert result["verdict"] == "INCONCLUSIVE" and "we could not tell" in result["reason"]
    sweep_file.write_text(sweep_file.read_text() + "  allow_inconclusive: true\n")
    assert _sweep(sweep_file, tmp_path / "allowed", CLEAN, good.url, base.url) == 0


def test_an_injecting_arm_is_a_canary_whether_or_not_it_says_so():
    """An arm with `inject:` and no `canary: true` is outside the family (issue 30: it was
    counted as a clean test, F = 4 instead of 2)."""
    spec = SweepSpec(
        name="f",
        models=[{"name": "m", "path": "fixture:tiny-llama"}],
        matrix={
            "arms": ["fixes-on", {"name": "zap", "inject": "zero-loaded-kv:0.5"}],
            "async_scheduling": [True],
            "concurrency": [1, 8],
        },
    )
    cells = expand_cells(spec)
    assert {c.arm.name: c.arm.canary for c in cells} == {"fixes-on": False, "zap": True}
    assert clean_tests(cells) == 2


def test_the_family_counts_suspect_hypotheses_where_suspect_is_judged():
    """With logprobs and 2 repeats SUSPECT is judged at every clean level, so each counts twice."""
    spec = SweepSpec(
        name="f",
        models=[{"name": "m", "path": "fixture:tiny-llama"}],
        eval={"logprobs": True, "repeats": 2},
        matrix={"arms": ["fixes-on"], "async_scheduling": [True], "concurrency": [1, 8]},
    )
    assert clean_tests(expand_cells(spec)) == 4


def test_a_shard_applies_holm_in_the_whole_selections_family(tmp_path):
    """A shard holding 2 of a selection's 4 clean tests: at finish its levels are adjusted in the
    planned family of 4 (4 × 0.016, no REGRESSION), not its own 2 (2 × 0.016 ≤ 0.05: the
    REGRESSION a shard used to give that the merged run did not)."""
    root = write_run(tmp_path / "run", [CellPlan("fixes-on", model="tiny-llama", drops={1: 6})])
    cell = next(c for c in load_run(root).cells)
    spec = cell.spec
    assert spec is not None and cell.provenance is not None
    cs = CellStore(root, cell.dirname, cell.provenance)
    for c in spec.concurrency:  # judged as the shard's engine judges: alone, at alpha / 4
        judge_level(spec, cs, c, family_size=4)
    store = open_run(root)
    assert store is not None
    apply_family(store)
    v = load_run(root).cells[0].verdicts[1].verdict
    assert v.family_size == 4 and v.p_value is not None
    assert v.adjusted_p_value is not None and abs(v.adjusted_p_value - 4 * v.p_value) < 1e-12
    assert v.verdict is not Verdict.REGRESSION, v.reason


def test_validate_prints_the_discordance_each_clean_design_tolerates(sweep_file, capsys):
    """`pdcheck validate` names, per clean design, the largest observed d its power rule allows,
    the one `tolerated_discordance` computes (rounded from the middle of its bracket, issue 42),
    with the fix past it, and the sweep's true-d pass points."""
    cells = expand_cells(load_sweep(str(sweep_file)))
    cell, _c, design = clean_level_designs(cells, family_size=clean_tests(cells))[0]
    d = tolerated_discordance(design, extra_pts=cell.analysis.power_extra_pts)
    assert main(["validate", str(sweep_file)]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert f"at most d = {100 * (d + SIZING_TOLERANCE / 2):.1f}% of their pairs" in out
    assert "INCONCLUSIVE unless its drop is shown within the margin" in out
    assert "eval.repeats" in out
    assert "passes the gate 95% of the time up to a true d = " in out
    assert "50% of the time up to a true d = " in out


def test_a_clean_level_whose_kv_digests_differ_is_a_regression(tmp_path):
    """Two corrupted questions in 200 are within a 5-point margin for the accuracy test, but
    their KV blocks differ between prefiller and decoder: the level is a REGRESSION, with the
    digests as its reason. Without digests the same records are not."""
    plans = [CellPlan("fixes-on", model="tiny-llama", drops={1: 2})]
    with_digests = write_run(tmp_path / "digests", plans, concurrency=(1,), kv_digest=True)
    v = load_run(with_digests).cells[0].verdicts[1].verdict
    assert v.verdict is Verdict.REGRESSION
    assert v.reason.startswith("KV digests: 2 of 400 KV blocks differ"), v.reason
    without = write_run(tmp_path / "accuracy", plans, concurrency=(1,))
    assert load_run(without).cells[0].verdicts[1].verdict.verdict is not Verdict.REGRESSION


def test_a_clean_level_whose_decoder_loaded_kv_with_no_read_completed_is_a_regression(tmp_path):
    """A decoder that exports NIXL's counters reports KV tokens loaded by transfer with no read
    completed: a load taken as finished before its read was done. The clean level is a
    REGRESSION with the counts, though its answers all match."""
    plans = [CellPlan("fixes-on", model="tiny-llama")]
    loaded = KvTransferMetrics(external_kv_tokens=5000.0, nixl_engines=1.0)
    root = write_run(tmp_path, plans, concurrency=(1,), kv_evidence={"decoders": (loaded,)})
    v = load_run(root).cells[0].verdicts[1].verdict
    assert v.verdict is Verdict.REGRESSION
    assert v.reason.startswith("transfer evidence: decoders report 5000 KV tokens"), v.reason


def test_a_clean_level_whose_prefiller_saw_reads_of_released_blocks_is_suspect(tmp_path):
    """Reads of blocks the prefiller had freed (early, or at a lease expiry an overloaded machine
    can cause): a clean level that would PASS is SUSPECT, with the count, not PASS."""
    plans = [CellPlan("fixes-on", model="tiny-llama")]
    read = KvTransferMetrics(
        external_kv_tokens=5000.0, transfers=20.0, bytes_transferred=1e6, nixl_engines=1.0
    )
    evidence = {"decoders": (read,), "prefiller_events": PrefillerLogEvents(read_after_release=3)}
    root = write_run(tmp_path, plans, concurrency=(1,), kv_evidence=evidence)
    v = load_run(root).cells[0].verdicts[1].verdict
    assert v.verdict is Verdict.SUSPECT
    assert "3 decoder reads finished for KV blocks the prefiller had already freed" in v.reason
    clean = write_run(
        tmp_path / "clean", plans, concurrency=(1,), kv_evidence={"decoders": (read,)}
    )
    assert load_run(clean).cells[0].verdicts[1].verdict.verdict is Verdict.PASS
