"""The runner: exact concurrency, request ids, the model field, errors kept apart, resume, preflight."""

from __future__ import annotations

import json
import threading
from dataclasses import replace

import pytest
from aiohttp import web

from pdcheck.config import EvalSettings
from pdcheck.errors import ConfigError, InfraError
from pdcheck.evals import read_records, run_eval
from pdcheck.evals.records import RecordWriter
from tests.fakes.openai_server import FakeOpenAIServer, echo_completion
from tests.unit.evals.conftest import (
    answer_right,
    asked_indices,
    make_task,
    rerun_asks_exactly_the_missing,
)


def test_exactly_n_requests_in_flight(tmp_path):
    """At concurrency N with more than N questions, the server sees N in flight at once and never more."""
    task = make_task(n_test=40)
    with FakeOpenAIServer(delay_s=0.05) as server:
        run_eval(
            server.url,
            task,
            settings=EvalSettings(shots=2),
            concurrency=7,
            out_path=tmp_path / "r",
            model="m",
        )
        assert server.max_in_flight == 7
        assert len(server.requests) == 41  # 40 questions + the preflight


def test_requests_carry_ids_model_and_scores(tmp_path):
    """Every question is sent with X-Request-Id <tag>-q<index:05d> and the model; records hold its score."""
    task = make_task(n_test=5)
    out = tmp_path / "r.jsonl"
    with FakeOpenAIServer(answer_right) as server:
        summary = run_eval(
            server.url + "/v1",
            task,
            settings=EvalSettings(shots=2),
            concurrency=2,
            out_path=out,
            run_tag="pd-c2-r0",
        )
        ids = sorted(h["X-Request-ID"] for h in server.headers)
        models = {r["model"] for r in server.requests}
    assert ids == ["pd-c2-r0-preflight"] + [f"pd-c2-r0-q{i:05d}" for i in range(5)]
    assert models == {"fake"}, (
        "the model defaults to the server's first /v1/models id and is always sent"
    )
    records = read_records(out)
    assert sorted(r.index for r in records) == list(range(5))
    assert all(r.ok and r.correct and r.gold == str(2 * r.index) for r in records)
    assert (summary.n, summary.accuracy, summary.error_rate, summary.model) == (5, 1.0, 0.0, "fake")


def test_failed_requests_are_errors_not_wrong_answers(tmp_path):
    """Questions whose request failed are errors: accuracy counts answered questions only."""
    task = make_task(n_test=6)

    def flaky(body):
        if body["max_tokens"] == 1:  # the preflight
            return echo_completion(body)
        if "What is 1 +" in body["prompt"] or "What is 4 +" in body["prompt"]:
            return web.Response(status=500, text="boom")
        return answer_right(body)

    with FakeOpenAIServer(flaky) as server:
        summary = run_eval(
            server.url,
            task,
            settings=EvalSettings(shots=1),
            concurrency=3,
            out_path=tmp_path / "r.jsonl",
            model="m",
        )
    failed = [r for r in read_records(tmp_path / "r.jsonl") if not r.ok]
    assert sorted(r.index for r in failed) == [1, 4]
    assert all(r.error == "HTTP 500: boom" and not r.correct and not r.invalid for r in failed)
    assert (
        summary.accuracy == 1.0 and summary.error_rate == pytest.approx(2 / 6) and summary.n_ok == 4
    )


def test_resume_asks_only_missing_and_failed_questions(tmp_path):
    """A run stopped half way keeps its records; rerunning asks only the missing and the failed ones."""
    task = make_task(n_test=10)
    out = tmp_path / "r.jsonl"
    settings = EvalSettings(shots=1)
    with FakeOpenAIServer(answer_right) as server:
        run_eval(
            server.url,
            task,
            settings=settings.model_copy(update={"limit": 5}),
            concurrency=2,
            out_path=out,
            model="m",
        )
    records = read_records(out)
    # Question 2 failed in the first run, and the run was killed mid-write of another line.
    out.unlink()
    with RecordWriter(out) as writer:
        for record in records:
            writer.write(
                record
                if record.index != 2
                else replace(record, ok=False, correct=False, error="timed out")
            )
    with open(out, "a") as f:
        f.write('{"index": 7, "prompt_sha')
    with FakeOpenAIServer(answer_right) as server:
        summary = run_eval(
            server.url, task, settings=settings, concurrency=2, out_path=out, model="m"
        )
        asked = sorted(
            int(h["X-Request-ID"].rsplit("q", 1)[1])
            for h in server.headers
            if "-q" in h["X-Request-ID"]
        )
    assert asked == [2, 5, 6, 7, 8, 9]
    final = read_records(out)
    assert sorted(r.index for r in final) == list(range(10)), (
        "one record per question, torn line gone"
    )
    assert summary.n == 10 and summary.accuracy == 1.0 and summary.error_rate == 0.0
    assert all(line.endswith("}") for line in out.read_text().splitlines())


def test_resume_refuses_records_asked_with_other_prompts(tmp_path):
    """Resuming a file written in another style would mix prompts: ConfigError, nothing sent."""
    task = make_task(n_test=4)
    out = tmp_path / "r.jsonl"
    with FakeOpenAIServer() as server:
        run_eval(
            server.url, task, settings=EvalSettings(shots=2), concurrency=2, out_path=out, model="m"
        )
        sent = len(server.requests)
        with pytest.raises(ConfigError, match="different prompt"):
            run_eval(
                server.url,
                task,
                settings=EvalSettings(shots=2, style="lm-eval"),
                concurrency=2,
                out_path=out,
                model="m",
            )
        assert len(server.requests) == sent


def test_preflight_failure_aborts_with_the_servers_error(tmp_path):
    """If the one-request preflight fails, the run stops with the server's message and writes nothing."""
    out = tmp_path / "r.jsonl"
    with FakeOpenAIServer(
        lambda b: web.Response(status=404, text="The model `m` does not exist.")
    ) as server:
        with pytest.raises(InfraError, match="does not exist"):
            run_eval(
                server.url,
                make_task(),
                settings=EvalSettings(shots=1),
                concurrency=2,
                out_path=out,
                model="m",
            )
        assert len(server.requests) == 1
    assert not out.exists()


def test_servers_refusing_token_ids_are_asked_without_them(tmp_path):
    """A server that rejects return_token_ids (not vLLM) is asked again without it, and the run goes on."""

    def strict(body):
        if "return_token_ids" in body:
            return web.Response(
                status=400,
                text=json.dumps({"error": "Unrecognized request argument: return_token_ids"}),
            )
        return echo_completion(body)

    with FakeOpenAIServer(strict) as server:
        summary = run_eval(
            server.url,
            make_task(n_test=3),
            settings=EvalSettings(shots=1),
            concurrency=2,
            out_path=tmp_path / "r.jsonl",
            model="m",
        )
    assert summary.error_rate == 0.0 and summary.n == 3


def test_on_record_sees_every_question_once(tmp_path):
    """The progress callback gets each finished record exactly once."""
    seen = []
    lock = threading.Lock()

    def on_record(record):
        with lock:
            seen.append(record.index)

    with FakeOpenAIServer() as server:
        run_eval(
            server.url,
            make_task(n_test=6),
            settings=EvalSettings(shots=1, limit=4, offset=1),
            concurrency=3,
            out_path=tmp_path / "r.jsonl",
            model="m",
            on_record=on_record,
        )
    assert sorted(seen) == [1, 2, 3, 4]


def test_bad_concurrency_is_a_config_error(tmp_path):
    """Concurrency below 1 is refused before anything is sent."""
    with pytest.raises(ConfigError, match="concurrency"):
        run_eval(
            "http://127.0.0.1:9",
            make_task(),
            settings=EvalSettings(),
            concurrency=0,
            out_path=tmp_path / "r",
        )


def test_chat_style_posts_messages_to_chat_completions(tmp_path):
    """chat style: /v1/chat/completions with one user message, scored from message.content like vllm style."""

    def chat(body):
        question = body["messages"][0]["content"].rsplit("Question: What is ", 1)[1]
        i = int(question.split(" ", 1)[0])
        return {
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": f"It is {2 * i}."},
                    "finish_reason": "stop",
                }
            ],
            "usage": {"prompt_tokens": 9, "completion_tokens": 4},
        }

    with FakeOpenAIServer(chat) as server:
        summary = run_eval(
            server.url,
            make_task(n_test=4),
            settings=EvalSettings(
                shots=1, style="chat", chat_template_kwargs={"enable_thinking": False}, no_stop=True
            ),
            concurrency=2,
            out_path=tmp_path / "r.jsonl",
            model="m",
        )
        bodies = [b for b in server.requests if b["max_tokens"] != 1]
    assert summary.accuracy == 1.0 and summary.error_rate == 0.0
    assert all(
        b["chat_template_kwargs"] == {"enable_thinking": False} and "stop" not in b for b in bodies
    )


def test_an_error_in_the_record_path_stops_the_run_and_keeps_finished_records(tmp_path):
    """An exception while recording (here the progress callback) ends the run with it; records written stay usable."""
    out = tmp_path / "r.jsonl"

    def on_record(record):
        raise RuntimeError("progress display broke")

    with FakeOpenAIServer(answer_right, delay_s=0.005) as server:
        with pytest.raises(RuntimeError, match="progress display broke"):
            run_eval(
                server.url,
                make_task(n_test=40),
                settings=EvalSettings(shots=1),
                concurrency=4,
                out_path=out,
                model="m",
                on_record=on_record,
            )
    kept = [r.index for r in read_records(out)]
    assert (
        kept
        and len(kept) < 40
        and len(set(kept)) == len(kept)
        and all(r.ok for r in read_records(out))
    )
    assert rerun_asks_exactly_the_missing(out, 40, concurrency=4).accuracy == 1.0


def test_should_stop_cancels_the_rest_and_returns_a_stopped_summary(tmp_path):
    """should_stop True after 5 records: the questions still out are cancelled, the summary covers what is
    on file and says stopped, and a rerun asks exactly the questions never answered."""
    out = tmp_path / "r.jsonl"
    seen = []

    def should_stop(record) -> bool:
        seen.append(record.index)
        return len(seen) == 5

    with FakeOpenAIServer(answer_right, delay_s=0.02) as server:
        summary = run_eval(
            server.url,
            make_task(n_test=60),
            settings=EvalSettings(shots=1),
            concurrency=4,
            out_path=out,
            model="m",
            should_stop=should_stop,
        )
        asked = asked_indices(server)
    kept = [r.index for r in read_records(out)]
    assert summary.stopped and summary.n == len(kept) and summary.accuracy == 1.0
    assert 5 <= len(kept) < 5 + 4 * 2, "at most the questions in flight finish after the stop"
    assert len(seen) == 5, "should_stop is not asked again once it said stop"
    assert len(asked) < 60 and len(set(kept)) == len(kept)
    rerun_asks_exactly_the_missing(out, 60, concurrency=4)
