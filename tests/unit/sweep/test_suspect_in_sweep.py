"""SUSPECT in a sweep (issue 29 item 7): calibrated from the baseline's own repeats, it fires on a
few corrupted-but-correct answers, and where it is off the verdict says why, never "no logprobs"
when logprobs were recorded. Through the sweep's own judging and finish (Holm over the family)."""

from __future__ import annotations

from pathlib import Path

from pdcheck.analysis.verdict import Verdict
from pdcheck.config import SweepSpec, expand_cells
from pdcheck.results.load import load_run
from pdcheck.results.schema import SweepInfo
from pdcheck.results.store import Provenance, create_run
from pdcheck.sweep.finish import finish_run
from pdcheck.sweep.judging import clean_tests, judge_level
from tests.unit.analysis.test_suspect import CORRUPTED, QUESTIONS
from tests.unit.analysis.test_suspect import _greedy_run as _run
from tests.unit.sweep.builders import unit_summary


def _sweep_run(root: Path, *, repeats: int, corrupted: frozenset[int]) -> Path:
    spec = SweepSpec(
        name="s",
        models=[{"name": "tiny-llama", "path": "fixture:tiny-llama"}],
        matrix={"concurrency": [1]},
        eval={"repeats": repeats, "logprobs": True},
        analysis={"margin_pts": 5.0},
    )
    (cell,) = expand_cells(spec)
    store = create_run(
        root,
        provenance=Provenance(vllm_version="0.32.0", dataset_sha256="d" * 64),
        sweep=SweepInfo(name="s", file="s.yaml", sha256="s" * 64),
        environment={},
    )
    cs = store.cell(cell.dirname)
    cs.write_cell(
        resolved=cell.resolved(),
        name=cell.name,
        cell_id=cell.id,
        baseline_key=cell.baseline_key(),
        canary=False,
    )
    for r in range(repeats):
        # A greedy run as on CPU (repeats agree bit for bit); a corrupted question keeps its
        # answer but flips a token the baseline was 3 nats sure of, its margins moved before.
        for side, records in (("baseline", _run()), ("pd", _run(corrupted=corrupted))):
            cs.records_path(side, 1, r).write_text("".join(x.to_json() + "\n" for x in records))
            cs.write_unit_summary(side, 1, r, unit_summary(records))
    judge_level(cell, cs, 1, family_size=clean_tests([cell]))
    finish_run(store)
    return root


CORRUPT = frozenset(range(0, QUESTIONS, QUESTIONS // CORRUPTED))


def test_five_corrupted_but_correct_answers_in_200_are_suspect_with_two_repeats(tmp_path):
    """Issue 29's bar: 5 of 200 answers corrupted but still correct in each PD repeat, 2 repeats
    (the baseline's second run is the control): the level is SUSPECT, its threshold the policy's
    floor because the baseline's repeats agree (PD's moved margins do not raise it), judged in
    one family with the accuracy test."""
    root = _sweep_run(tmp_path / "run", repeats=2, corrupted=CORRUPT)
    entry = load_run(root).cells[0].verdicts[1]
    assert entry.verdict.verdict is Verdict.SUSPECT, entry.verdict.reason
    assert entry.verdict.delta_pts == 0.0 and entry.verdict.family_size == 2
    control = entry.comparison.control if entry.comparison else None
    assert control is not None and control.source == "baseline-repeat"
    assert (control.pd_count, control.pd_pairs, control.control_count) == (10, 400, 0)
    assert control.tie_epsilon_nats == 0.05


def test_with_one_repeat_suspect_is_off_and_says_there_is_no_control(tmp_path):
    """One repeat and logprobs recorded: SUSPECT is off for want of a control run, and the
    verdict says exactly that, not that no logprobs were recorded."""
    root = _sweep_run(tmp_path / "run", repeats=1, corrupted=CORRUPT)
    reason = load_run(root).cells[0].verdicts[1].verdict.reason
    assert "SUSPECT off: no control run (eval.repeats ≥ 2, or --control)" in reason
    assert "no logprobs" not in reason
