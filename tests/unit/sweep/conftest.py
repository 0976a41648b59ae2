"""Fake baseline/PD servers that answer gsm8k-synth from its gold answers, and a small sweep file."""

from __future__ import annotations

import re
import textwrap

import huggingface_hub
import pytest

from pdcheck.config import EvalSettings
from pdcheck.evals import load_task
from tests.fakes.hub import FakeHub
from tests.fakes.openai_server import FakeOpenAIServer, echo_completion

LIMIT = 16
_LAST_QUESTION = re.compile(r"Question: ([^\n]*)\nAnswer:\s*$")


@pytest.fixture(autouse=True)
def unreachable_hub(monkeypatch):
    """No sweep test asks the real Hugging Face Hub (a dry run of a hub model sizes its weights)."""
    hub = FakeHub(reachable=False)
    monkeypatch.setattr(huggingface_hub, "snapshot_download", hub.snapshot_download)
    return hub


@pytest.fixture(scope="session")
def gold_by_question() -> dict[str, str]:
    task = load_task(EvalSettings(task="gsm8k-synth"))
    return {ex.question.strip(): ex.final_answer for ex in task.test[:LIMIT]}


def answering(gold: dict[str, str], *, wrong: bool = False):
    """A responder that answers right (or, with `wrong`, off by one) for every question."""

    def respond(body):
        question = _LAST_QUESTION.search(body.get("prompt", "")).group(1).strip()
        answer = int(gold[question]) + (1 if wrong else 0)
        return echo_completion(body, f" It is {answer}.\n#### {answer}")

    return respond


@pytest.fixture
def servers(gold_by_question):
    """(baseline, good PD, broken PD) fake servers, started for one test."""
    with (
        FakeOpenAIServer(answering(gold_by_question)) as base,
        FakeOpenAIServer(answering(gold_by_question)) as good,
        FakeOpenAIServer(answering(gold_by_question, wrong=True)) as bad,
    ):
        yield base, good, bad


@pytest.fixture
def sweep_file(tmp_path):
    path = tmp_path / "fake.yaml"
    path.write_text(
        textwrap.dedent(f"""\
        schema_version: 1
        name: fake
        models:
          - name: fake
            path: /nonexistent/fake-model
        matrix:
          arms: [fixes-on, inject-zero]
          concurrency: [1, 4]
        eval:
          task: gsm8k-synth
          limit: {LIMIT}
          max_tokens: 16
        analysis:
          # 16 questions resolve only large drops; a smaller margin would make clean cells INCONCLUSIVE.
          margin_pts: 40
        """)
    )
    return path
