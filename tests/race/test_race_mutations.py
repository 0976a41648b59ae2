"""Mutation tests: small in-process breakages of the fixes that real code could ship; each must be caught.

The fence mutations are equivalent at queue depth 2 (deferred frees are drained only when the next
output is processed, so a fence one step early frees at the same moment); they are checked at PP
depth 3 with aborts, where they do free blocks under a step in flight.
"""

from __future__ import annotations

import pytest

from pdcheck._vllm.mutations import MUTATIONS
from pdcheck.race import run_race

from .conftest import CI_REQUESTS

pytestmark = pytest.mark.vllm

# mutation -> (variant that exercises it, family that must be found)
CASES = {
    "free-fence-off-by-one": ("attention", "BLOCK_REUSE"),
    "deferred-fence-one-early": ("pp3-aborts", "BLOCK_REUSE"),
    "drain-before-processed": ("pp3-aborts", "BLOCK_REUSE"),
    "abort-frees-at-once": ("aborts", "BLOCK_REUSE"),
    "skip-zeroing-first-group-only": ("hybrid-align", "ZEROING"),
    "no-rezero-after-failed-load": ("load-failures", "ZEROING"),
}


def test_every_registered_mutation_has_a_case(adapter):
    """A new mutation must come with a test case that shows it is caught."""
    assert set(CASES) == set(MUTATIONS)


@pytest.mark.parametrize("mutation", sorted(CASES))
def test_mutation_is_caught(adapter, mutation):
    """Each mutation of the fixes is caught in at least 4 of 5 seeds, as the family it breaks."""
    variant, family = CASES[mutation]
    summary = run_race(seeds=5, requests=CI_REQUESTS, variants=[variant], mutation=mutation)
    result = summary.variants[0]
    assert result.seeds_by_family.get(family, 0) >= 4, (
        f"{mutation} on {variant}: {result.findings_by_kind}"
    )
    assert summary.mutation == mutation and summary.exit_code == 1
