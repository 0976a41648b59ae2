"""The harness faithful per release, on the installed vLLM: every variant runs, the Mamba mode is the
one the variant names, and the pre-0.30 way of reporting a failed load is handled cleanly."""

from __future__ import annotations

import pytest

from pdcheck._vllm import versions
from pdcheck.race import run_race
from pdcheck.race.workload import VARIANTS, get_variant

from .conftest import CI_REQUESTS

pytestmark = pytest.mark.vllm


def test_every_variant_runs_clean_on_the_installed_vllm(adapter):
    """The installed build has both fixes and failed_recving: no variant is refused, none reports."""
    summary = run_race(seeds=1, requests=CI_REQUESTS, variants=list(VARIANTS))
    assert [v.variant for v in summary.variants if v.unsupported] == []
    found = {v.variant: v.findings_by_kind for v in summary.variants if v.seeds_with_findings}
    assert found == {}, f"false positives on the installed vLLM: {found}"


def test_the_harness_names_the_mamba_mode_of_its_variant(adapter):
    """Before 0.28.0 vLLM defaults Granite-4.0-H to mode "all" when prefix caching is on; the
    hybrid-align variant must run "align" on every release (its state model is align's)."""
    from pdcheck._vllm.sim_scheduler import SimScheduler

    sched = SimScheduler(get_variant("hybrid-align").scheduler)
    assert sched.mamba_cache_mode == "align"


def test_failed_loads_reported_only_by_invalid_blocks_are_clean(adapter, monkeypatch):
    """As on 0.22-0.29 (no failed_recving): a whole failure is reported by its invalid blocks, and
    the shipped scheduler recovers from it cleanly; the hybrid variant is refused with the reason."""
    monkeypatch.setattr(versions, "reports_failed_loads", lambda: False)
    summary = run_race(
        seeds=2,
        requests=CI_REQUESTS,
        variants=["load-failures", "load-failures-fail", "hybrid-load-failures"],
    )
    by_name = {v.variant: v for v in summary.variants}
    assert by_name["hybrid-load-failures"].unsupported
    assert by_name["hybrid-load-failures"].seeds == 0
    found = {v.variant: v.findings_by_kind for v in summary.variants if v.seeds_with_findings}
    assert found == {}
    assert summary.exit_code == 0
