"""pdcheck's runner (lm-eval style) and lm-eval's own engine agree question by question.

Both engines ask the same fake server, which answers each question with a fixed completion
chosen to exercise the filters (`#### N`, a bare number, `#### 1,000.`, a wrong number, no
number). lm-eval's engine takes about 30 s (its import and context building), so this lives
beside the integration tests; it starts no vLLM server.
"""

from __future__ import annotations

import os

from pdcheck.config import EvalSettings
from pdcheck.evals import load_task, read_records, run_eval
from tests.fakes.openai_server import FakeOpenAIServer, echo_completion

N_QUESTIONS = 30


def _fixed_completions(task):
    """question text -> a completion; the kind cycles with the question's index."""
    out = {}
    for i, ex in enumerate(task.test[:N_QUESTIONS]):
        gold = ex.final_answer
        out[ex.question] = [
            f" So that is {gold} in all.\n#### {gold}",
            f" The answer is ${gold}.",
            " #### 12345678",
            " I do not know.",
            f" #### {int(gold):,}." if gold.isdigit() else f" #### {gold}",
        ][i % 5]
    return out


def test_both_engines_score_every_question_the_same(gsm8k_dir, tmp_path, monkeypatch):
    """Same prompts (sha256), same strict/flexible answers and the same correctness on every question."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "hf-datasets"))
    settings = EvalSettings(dataset=gsm8k_dir, limit=N_QUESTIONS, style="lm-eval")
    task = load_task(settings)
    completions = _fixed_completions(task)

    def responder(body):
        prompt = body["prompt"][0] if isinstance(body["prompt"], list) else body["prompt"]
        question = prompt.rsplit("Question: ", 1)[1].removesuffix("\nAnswer:")
        return echo_completion(body, text=completions.get(question, " 0"))

    with FakeOpenAIServer(responder) as server:
        ours = run_eval(
            server.url, task, settings=settings, concurrency=8, out_path=tmp_path / "pdcheck.jsonl"
        )
        theirs = run_eval(
            server.url,
            task,
            settings=settings.model_copy(update={"engine": "lm-eval"}),
            concurrency=8,
            out_path=tmp_path / "lmeval.jsonl",
        )
    a = {r.index: r for r in read_records(tmp_path / "pdcheck.jsonl")}
    b = {r.index: r for r in read_records(tmp_path / "lmeval.jsonl")}
    assert sorted(a) == sorted(b) == list(range(N_QUESTIONS))
    for i in range(N_QUESTIONS):
        assert a[i].prompt_sha256 == b[i].prompt_sha256, (
            f"question {i}: lm-eval sent another prompt"
        )
        assert (a[i].correct, a[i].invalid, a[i].answers) == (
            b[i].correct,
            b[i].invalid,
            b[i].answers,
        ), f"question {i}"
        assert a[i].gold == b[i].gold
    assert ours.accuracy == theirs.accuracy == 12 / 30  # kinds 0 and 4 are right under strict-match
    assert os.path.isdir(tmp_path / "hf-datasets"), (
        "lm-eval read the local files through datasets' json loader"
    )
