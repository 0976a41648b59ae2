"""The harness's per-release model without vLLM: how a failed load is reported, how a zeroed read is
classified, and which variant a release cannot run (issue 39, item 3)."""

from __future__ import annotations

import pytest

from pdcheck._vllm import versions
from pdcheck._vllm.records import GroupInfo, LoadStart
from pdcheck.race import run as race_run
from pdcheck.race.findings import Family, Finding, Kind
from pdcheck.race.run import VariantResult, unsupported_variant
from pdcheck.race.sim import PendingLoad, RaceSim
from pdcheck.race.workload import get_variant


class _FakeScheduler:
    """Only what RaceSim reads outside a run: the KV groups and the release's failure reporting."""

    groups = (GroupInfo("attention", 16),)
    needs_zeroing = True

    def __init__(self, *, reports_failed_loads: bool) -> None:
        self.reports_failed_loads = reports_failed_loads


class _AlwaysLow:
    """An rng whose every draw picks the whole-failure branch."""

    def random(self) -> float:
        return 0.0


def _sim(*, reports_failed_loads: bool) -> RaceSim:
    workload = get_variant("load-failures").with_overrides(requests=4)
    sim = RaceSim(workload, 0, _FakeScheduler(reports_failed_loads=reports_failed_loads))  # type: ignore[arg-type]
    sim.rng = _AlwaysLow()  # type: ignore[assignment]
    return sim


def _whole_failure(sim: RaceSim) -> None:
    rid = next(iter(sim.pending_requests)).request_id
    sim.tags[rid] = list(range(1, 200))
    load = LoadStart(rid, ((7, 8, 9),), 16, 40)
    sim.loads[rid] = PendingLoad(load, 1, 1, 0, valid_blocks=0)


def test_a_whole_failed_load_is_reported_as_failed_where_the_release_can():
    """From 0.30.0 (failed_recving) a whole failure may be reported as a failed receive."""
    sim = _sim(reports_failed_loads=True)
    _whole_failure(sim)
    ok, failed, invalid = sim._reports()
    assert failed and not ok and not invalid


def test_a_whole_failed_load_is_reported_by_its_invalid_blocks_before_failed_recving():
    """Before 0.30.0 vLLM learns of a failed load only from invalid_block_ids: every block the load
    should have written from its first one (a prefix hit before it stays valid). Reporting the
    request as merely finished made vLLM read a load that never landed (BLOCK_REUSE on 0.26-0.29)."""
    sim = _sim(reports_failed_loads=False)
    _whole_failure(sim)
    ok, failed, invalid = sim._reports()
    assert not failed
    assert len(ok) == 1
    assert invalid == {8, 9}  # tokens [16, 40): blocks 1 and 2 of the table


@pytest.mark.parametrize(
    ("loaded", "kind"),
    [
        (
            (5, 6),
            Kind.CORRUPTION_ZEROED_AFTER_LOAD,
        ),  # the load of the step that zeroed, landed first
        ((3, 2), Kind.READ_UNCOMPUTED_KV),  # a previous owner's load, long before this zeroing
        (None, Kind.READ_UNCOMPUTED_KV),  # no load ever wrote the block
    ],
)
def test_a_zeroed_read_is_zeroing_only_when_the_zeroing_came_after_its_load(loaded, kind):
    """A live request reading a zero slot is the zeroing race only if the zeroing landed after a
    load the same step started; otherwise the scheduler counted tokens nobody computed."""
    sim = _sim(reports_failed_loads=True)
    rid = next(iter(sim.pending_requests)).request_id
    sim.tags[rid] = list(range(1, 200))
    sim.memory.zero(11, ("zero", "", 5, 7))
    if loaded is not None:
        sim._block_loaded[11] = loaded
    sim._kv_mismatch(rid, 11, 0, 32, 8)
    assert [f.kind for f in sim.findings] == [kind]


def test_read_uncomputed_kv_is_a_defect_of_its_own_family():
    """READ_UNCOMPUTED_KV is neither race: family OTHER, corruption (not a hazard)."""
    finding = Finding(Kind.READ_UNCOMPUTED_KV, 0, 3, (4,), "r1", "zero", "d")
    assert finding.family is Family.OTHER and not finding.is_hazard


def test_hybrid_load_failures_cannot_run_before_failed_recving(monkeypatch):
    """Before 0.30.0 the variant is refused with the reason; other variants and newer releases run."""
    monkeypatch.setattr(versions, "mamba_align_connector_unsupported", lambda: None)
    monkeypatch.setattr(versions, "reports_failed_loads", lambda: False)
    reason = unsupported_variant(get_variant("hybrid-load-failures"))
    assert reason is not None and versions.FAILED_RECVING_FIRST_RELEASE in reason
    assert unsupported_variant(get_variant("load-failures")) is None
    assert unsupported_variant(get_variant("hybrid-align")) is None
    monkeypatch.setattr(versions, "reports_failed_loads", lambda: True)
    assert unsupported_variant(get_variant("hybrid-load-failures")) is None


def test_an_unsupported_variant_round_trips_and_counts_as_no_findings():
    """The sweep stores race JSON: the reason survives, and a variant that cannot run is not a finding."""
    result = race_run._unsupported_result("hybrid-load-failures", "why")
    again = VariantResult.from_dict(result.to_dict())
    assert again == result and again.unsupported == "why"
    assert again.seeds == 0 and again.seeds_with_findings == 0


def test_align_variants_cannot_run_where_align_refuses_connector_loads(monkeypatch):
    """0.22.0 asserts no external tokens in Mamba align mode: every align variant is refused with
    that reason, mode "none" and attention variants still run."""
    monkeypatch.setattr(versions, "mamba_align_connector_unsupported", lambda: "align refuses")
    monkeypatch.setattr(versions, "reports_failed_loads", lambda: False)
    for name in ("hybrid-align", "hybrid-align-3mamba", "aborts", "hybrid-load-failures"):
        assert unsupported_variant(get_variant(name)) == "align refuses"
    for name in ("hybrid-none", "attention", "attention-zeroing", "pp3"):
        assert unsupported_variant(get_variant(name)) is None


def test_a_family_seen_after_the_kept_findings_still_counts():
    """Only the first MAX_FINDINGS_KEPT findings keep reproducers, but every finding's family counts:
    0.24/0.25's second block-reuse race shows up after hundreds of zeroing findings."""
    from pdcheck.race.sim import MAX_FINDINGS_KEPT

    sim = _sim(reports_failed_loads=True)
    for i in range(MAX_FINDINGS_KEPT + 5):
        sim._report(Kind.ZEROING_OF_LOAD_TARGET, 3 + i, (i + 1,), "r1", "zeroing", "d")
    sim._report(Kind.CORRUPTION_MAMBA_STALE_WRITE, 90, (2,), "r2", "r3", "d")
    assert len(sim.findings) == MAX_FINDINGS_KEPT
    assert sim.first_step_by_family == {"ZEROING": 3, "BLOCK_REUSE": 90}
