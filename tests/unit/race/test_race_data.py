"""Race harness data without vLLM: findings, workloads, switches parsing, shadow tags."""

from __future__ import annotations

import random

import pytest

from pdcheck.errors import ConfigError
from pdcheck.race.findings import Family, Finding, Kind, Reproducer
from pdcheck.race.shadow import GARBLE, POISON, ZERO, ShadowMemory, prefix_tags, state_tag
from pdcheck.race.workload import VARIANTS, Workload, generate_requests, get_variant
from pdcheck.vllm_plugin.switches import parse_fixes


def test_finding_round_trips_through_json_dict():
    """A Finding (with its reproducer) survives to_dict/from_dict unchanged: the sweep stores race JSON."""
    rep = Reproducer(
        3,
        "attention",
        ("sim.dispatch()  # step 1",),
        {7: ("step 1: -> r00001",)},
        "--disable-fix zeroing",
    )
    finding = Finding(
        Kind.CORRUPTION_STALE_KV_WRITE, 3, 12, (7,), "r00002", "r00001", "detail", True, rep
    )
    again = Finding.from_dict(finding.to_dict())
    assert again == finding
    assert again.family is Family.BLOCK_REUSE and not again.is_hazard


def test_reproducer_renders_a_replay_command_and_block_timelines():
    """The printed slice starts with the command that replays the seed and ends with each block's owners."""
    text = Reproducer(
        5,
        "hybrid-align",
        ("sim.execute()  # step 4",),
        {9: ("step 2: -> r1", "step 4: r1 finished (stop)")},
        "--depth 3",
    ).render()
    assert (
        text.splitlines()[0]
        == "# replay: pdcheck race --variant hybrid-align --seed-start 5 --seeds 1 --depth 3"
    )
    assert "# block 9: step 2: -> r1; step 4: r1 finished (stop)" in text


def test_every_kind_has_a_family_and_hazards_are_ownership_kinds():
    """Every detailed kind maps to BLOCK_REUSE, ZEROING or OTHER; the hazard set holds only ownership kinds."""
    for kind in Kind:
        assert Finding(kind, 0, 0, (), "", "", "").family in Family
    assert Finding(Kind.ZEROING_OF_LOAD_TARGET, 0, 0, (), "", "", "").is_hazard


def test_same_seed_generates_the_same_requests_and_different_seeds_differ():
    """Workload generation is a pure function of the rng passed in (the determinism bar starts here)."""
    w = get_variant("attention")
    a = generate_requests(w, random.Random(4))
    b = generate_requests(w, random.Random(4))
    c = generate_requests(w, random.Random(5))
    assert a == b and a != c
    assert len(a) == w.requests
    assert any(r.remote for r in a) and not all(r.remote for r in a)


def test_generated_requests_fit_the_model_length():
    """No generated request can exceed max_model_len, including slack tokens for in-flight steps."""
    for w in VARIANTS.values():
        for r in generate_requests(w, random.Random(0)):
            assert len(r.tokens) <= w.scheduler.max_model_len


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"remote_fraction": 1.5}, "remote_fraction"),
        ({"prompt_tokens": (8, 600)}, "max_model_len"),
        ({"depth": 0}, "depth"),
    ],
)
def test_bad_workload_fails_at_construction_with_the_fix(changes, message):
    """A bad workload is a ConfigError at construction naming the field, before any scheduler is built."""
    with pytest.raises(ConfigError, match=message):
        get_variant("attention").with_overrides(**changes)


def test_unknown_variant_lists_the_allowed_ones():
    """An unknown variant name is a ConfigError that lists every allowed variant."""
    with pytest.raises(ConfigError, match="allowed: attention"):
        get_variant("nope")


def test_parse_fixes_accepts_env_syntax_and_rejects_unknown_names():
    """PDCHECK_DISABLE_FIXES syntax: comma-separated, blanks ignored, order normalised; unknown names rejected."""
    assert parse_fixes("zeroing, block-reuse,") == ("block-reuse", "zeroing")
    assert parse_fixes("") == ()
    with pytest.raises(ConfigError, match="allowed: block-reuse, zeroing"):
        parse_fixes("block_reuse")


def test_prefix_tags_identify_prefixes_and_never_collide_with_markers():
    """Equal prefixes give equal tags (prefix-cache hits check by content); tags are never ZERO/GARBLE/POISON."""
    a = prefix_tags((5, 6, 7))
    b = prefix_tags((5, 6, 8))
    assert a[:2] == b[:2] and a[2] != b[2]
    assert not {ZERO, GARBLE, POISON} & set(a + b + [state_tag(a, 3)])
    assert state_tag(a, 2) != a[1]


def test_shadow_views_alias_a_state_write_garbles_slots_and_a_slot_write_garbles_the_state():
    """One block id is one page: a Mamba state write garbles its token slots and a slot write garbles the state."""
    mem = ShadowMemory(4, 4)
    mem.write_state(1, 99, ("state", "r1", 1))
    assert mem.slots[1] == [GARBLE] * 4
    mem.write_slot(1, 0, 42, ("kv", "r2", 2))
    assert mem.states[1] == GARBLE and mem.slots[1][0] == 42
    mem.zero(1, ("zero", "", 3))
    assert mem.states[1] == ZERO and mem.slots[1] == [ZERO] * 4


def test_workload_is_frozen_data():
    """Workloads are frozen: a variant cannot be changed in place by one test or run for the next."""
    w = Workload("x", get_variant("attention").scheduler)
    with pytest.raises(AttributeError):
        w.requests = 1  # type: ignore[misc]


def test_race_summary_round_trips_and_maps_findings_to_exit_1():
    """RaceSummary.to_dict/from_dict is lossless (the sweep stores it); any seed with findings means exit 1."""
    from pdcheck.errors import ExitCode
    from pdcheck.race.run import RaceSummary, VariantResult

    finding = Finding(Kind.ZEROING_OF_LOAD_TARGET, 1, 3, (4,), "r00002", "zeroing", "d")
    found = VariantResult(
        "hybrid-align",
        2,
        1,
        {"ZEROING": 1},
        {"ZEROING": 3.0},
        {"ZEROING_OF_LOAD_TARGET": 5},
        0,
        900,
        0.5,
        (finding,),
    )
    clean = VariantResult("attention", 2, 0, {}, {}, {}, 0, 800, 0.4, ())
    summary = RaceSummary("0.32.0", ("zeroing",), (), None, 2, 0, 300, None, (found, clean))
    data = summary.to_dict()
    assert data["schema_version"] == 1 and data["has_findings"] is True
    assert RaceSummary.from_dict(data).to_dict() == data
    assert summary.exit_code is ExitCode.FAILED
    assert RaceSummary("0.32.0", (), (), None, 2, 0, 300, None, (clean,)).exit_code is ExitCode.OK
