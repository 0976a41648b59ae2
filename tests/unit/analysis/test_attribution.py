"""Race attribution: each rule names its race only from the arms that show its signature, with evidence."""

from __future__ import annotations

import pytest

from pdcheck.analysis import ArmObservation, Attribution, Verdict, attribute
from pdcheck.analysis.attribution import HARNESS_FAMILIES, RULES
from pdcheck.config import expand_cells, load_sweep
from tests.unit.analysis.builders import json_round_trip

P, R, S = Verdict.PASS, Verdict.REGRESSION, Verdict.SUSPECT


def arm(
    cell,
    *,
    kind="hybrid",
    async_=True,
    fixes=(),
    inject=None,
    verdicts=None,
    deltas=None,
    model="m",
    carried=None,
):
    """An arm; a level carried by an early stop (`carried`: level -> from) has no Δ, as in a run."""
    verdicts = verdicts or {1: P}
    carried = carried or {}
    deltas = deltas or {c: 0.0 for c in verdicts if c not in carried}
    return ArmObservation(
        cell=cell,
        model=model,
        kind=kind,
        async_scheduling=async_,
        disabled_fixes=tuple(fixes),
        inject=inject,
        verdicts=verdicts,
        delta_pts=deltas,
        carried_from=carried,
    )


def races(attrs: list[Attribution]) -> set[tuple[str, str]]:
    return {(a.cell, a.race) for a in attrs}


def test_every_rule_is_a_named_predicate_with_evidence():
    """Rules are data: unique names, each with a predicate and an evidence builder."""
    names = [r.name for r in RULES]
    assert len(names) == len(set(names))
    assert all(callable(r.holds) and callable(r.evidence) for r in RULES)


def test_scheduling_race_signature():
    """Fails with async on, passes with async off, worse with concurrency -> scheduling race."""
    on = arm("on", verdicts={1: P, 8: R, 32: R}, deltas={1: -0.5, 8: -7.0, 32: -40.0})
    off = arm("off", async_=False, verdicts={1: P, 8: P, 32: P})
    out = attribute([on, off])
    assert races(out) == {("on", "scheduling race")}
    ev = out[0].evidence
    assert any("async off" in e for e in ev) and any("worse with concurrency" in e for e in ev)


def test_no_scheduling_race_when_better_with_concurrency():
    """A failure that shrinks with concurrency does not have the scheduling-race signature."""
    on = arm("on", verdicts={1: R, 32: R}, deltas={1: -20.0, 32: -5.0})
    off = arm("off", async_=False, verdicts={1: P, 32: P})
    assert attribute([on, off]) == []


def test_block_reuse_recovers_with_its_fix_on():
    """Flagged with the block-reuse fix off and PASS with it on -> block-reuse, on any model kind."""
    broken = arm("br-off", kind="full-attention", fixes=("block-reuse",), verdicts={8: S})
    fixed = arm("fixes-on", kind="full-attention", verdicts={8: P})
    assert races(attribute([broken, fixed])) == {("br-off", "block-reuse")}


def test_zeroing_needs_a_hybrid_model():
    """Recovers with the zeroing skip on on a hybrid -> zeroing; a full-attention model has no zeroing."""
    hybrid = [arm("z-off", fixes=("zeroing",), verdicts={8: R}), arm("fixes-on", verdicts={8: P})]
    out = attribute(hybrid)
    assert races(out) == {("z-off", "zeroing")}
    assert any("attention layers only" in e for e in out[0].evidence)
    full = [
        arm("z-off", kind="full-attention", fixes=("zeroing",), verdicts={8: R}),
        arm("fixes-on", kind="full-attention", verdicts={8: P}),
    ]
    assert attribute(full) == []


def test_both_fixes_off_without_single_fix_arms_names_both():
    """Only fixes-off vs fixes-on: the two races cannot be told apart, and the evidence says so."""
    out = attribute(
        [arm("fixes-off", fixes=("block-reuse", "zeroing"), verdicts={8: R}), arm("fixes-on")]
    )
    assert races(out) == {("fixes-off", "block-reuse or zeroing")}
    with_single = [
        arm("fixes-off", fixes=("block-reuse", "zeroing"), verdicts={8: R}),
        arm("fixes-on"),
        arm("z-off", fixes=("zeroing",), verdicts={8: R}),
    ]
    assert ("fixes-off", "block-reuse or zeroing") not in races(attribute(with_single))


def test_injected_arms_name_the_injected_effect():
    """An injected-fault arm that is flagged is attributed to its injection, not to a race."""
    out = attribute([arm("inject", inject="zero-loaded-kv:0.5", verdicts={1: R}), arm("fixes-on")])
    assert races(out) == {("inject", "injected:zero-loaded-kv")}


def test_failure_with_async_off_points_at_the_transfer():
    """Flagged with one batch in flight: neither race can happen, so suspect the KV transfer."""
    assert races(attribute([arm("sync", async_=False, verdicts={1: R})])) == {
        ("sync", "pd-transfer")
    }


def test_arms_of_other_models_are_not_counterparts():
    """A passing arm of another model does not make this model's failure 'recover'."""
    out = attribute(
        [arm("br-off", fixes=("block-reuse",), verdicts={8: R}), arm("other", model="x")]
    )
    assert out == []


def test_harness_findings_by_family():
    """Race-harness findings name the race of their family; an unknown family is an error listing the known ones."""
    out = attribute([], race_findings_by_family={"BLOCK_REUSE": 3, "ZEROING": 2, "OTHER": 0})
    assert {(a.race, a.cell) for a in out} == {
        ("block-reuse", "race-harness"),
        ("zeroing", "race-harness"),
    }
    with pytest.raises(ValueError, match="known: BLOCK_REUSE"):
        attribute([], race_findings_by_family={"STALE": 1})


def test_harness_families_match_the_race_module():
    """The family names attribution reads are exactly the ones the race harness writes."""
    from pdcheck.race.findings import Family

    assert set(HARNESS_FAMILIES) == {f.value for f in Family}


def test_from_cell_and_json_round_trip():
    """Observations build from sweep cells, and attributions survive JSON."""
    spec = load_sweep("sweeps/cpu-smoke.yaml")
    cell = expand_cells(spec)[0]
    obs = ArmObservation.from_cell(cell, verdicts={1: R}, delta_pts={1: -9.0})
    assert obs.model == cell.model.name and obs.async_scheduling == cell.async_scheduling
    assert json_round_trip(obs) == obs
    a = Attribution(race="zeroing", rule="zeroing-fix", cell="c", evidence=("x", "y"))
    assert json_round_trip(a) == a


def test_a_carried_level_says_where_it_came_from_never_nan():
    """An early stop carried c1's REGRESSION to c8, which did not run and has no Δ: the
    evidence says "carried from c1" (issue 40), never "+nan pts"."""
    fixes_off = arm(
        "off", fixes=("block-reuse",), verdicts={1: R, 8: R}, deltas={1: -30.0}, carried={8: 1}
    )
    fixes_on = arm("on", verdicts={1: P, 8: P})
    named = attribute([fixes_off, fixes_on])
    assert named and any("carried from c1" in e for a in named for e in a.evidence), named
    text = fixes_off.describe()
    assert "c8: REGRESSION (carried from c1)" in text and "nan" not in text.lower(), text
    assert "c1: REGRESSION (-30.0 pts)" in text
    for a in named:
        assert all("nan" not in e.lower() for e in a.evidence), a.evidence


def test_the_shipped_example_run_summarizes_without_nan():
    """The README's stored example run (its c8 levels carried from c1 by early stop), summarized
    by today's code: the attribution names where each carried level came from, with no NaN."""
    from pathlib import Path

    from pdcheck.results.load import load_run
    from pdcheck.results.summary import summarize

    (run,) = (Path(__file__).parents[3] / "docs" / "example-run").iterdir()
    summary = summarize(load_run(run))
    evidence = [e for a in summary.attribution for e in a.evidence]
    assert evidence and all("nan" not in e.lower() for e in evidence), evidence
    assert any("carried from c1" in e for e in evidence), evidence
