"""complete() turns every per-request failure into an Outcome with the reason, and parses good answers."""

from __future__ import annotations

import asyncio
import socket

import aiohttp
import pytest
from aiohttp import web

from pdcheck.evals.client import CompletionRequest, base_url, complete, parse_response
from tests.fakes.openai_server import FakeOpenAIServer, echo_completion
from tests.unit.hung_server import hung_server


def _run(url: str, body: dict, **kwargs):
    async def go():
        async with aiohttp.ClientSession() as session:
            return await complete(session, CompletionRequest(url, body, "tag-q00001"), **kwargs)

    return asyncio.run(go())


@pytest.mark.parametrize(
    ("responder", "reason", "status"),
    [
        (lambda b: web.Response(status=500, text="engine dead"), "HTTP 500: engine dead", 500),
        (
            lambda b: web.Response(status=404, text="model not found"),
            "HTTP 404: model not found",
            404,
        ),
        (lambda b: web.Response(text="<html>oops</html>"), "response is not JSON", 200),
        (lambda b: {"choices": []}, "response has no choices", 200),
        (lambda b: {"object": "error"}, "response has no choices", 200),
        (lambda b: {"choices": [{"index": 0}]}, "choices[0] has no text", 200),
        (lambda b: [1, 2], "not an object", 200),
        (
            lambda b: {
                "choices": [{"text": "x", "logprobs": {"tokens": ["a"], "token_logprobs": ["bad"]}}]
            },
            "logprobs is malformed",
            200,
        ),
    ],
)
def test_garbage_answers_are_errors_with_the_reason(responder, reason, status):
    """HTTP errors and unusable bodies give ok=False with the reason and status, tried once, never raised."""
    with FakeOpenAIServer(responder) as server:
        outcome = _run(server.url + "/v1/completions", {"prompt": "p"})
        assert len(server.requests) == 1, "HTTP answers are never retried"
    assert not outcome.ok and outcome.text is None
    assert reason in outcome.error
    assert (outcome.http_status, outcome.attempts) == (status, 1)


def test_timeout_is_an_error():
    """A server slower than the per-request timeout gives ok=False 'timed out', not an exception."""
    with hung_server() as server:
        outcome = _run(server.url + "/v1/completions", {"prompt": "p"}, timeout_s=0.2)
    assert not outcome.ok and outcome.error == "timed out after 0.2 s"
    assert outcome.attempts == 1


def test_connection_errors_are_retried_and_counted():
    """A refused connection is retried up to max_attempts, then reported as a connection error."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed when the block ends: nothing listens there
    outcome = _run(
        f"http://127.0.0.1:{port}/v1/completions",
        {"prompt": "p"},
        max_attempts=3,
        retry_delay_s=0.01,
    )
    assert not outcome.ok and outcome.error.startswith("connection error")
    assert outcome.attempts == 3


def test_good_completion_with_logprobs_and_token_ids():
    """A vLLM completions answer yields text, finish reason, usage, token ids and ranked top-2 logprobs."""

    def responder(body):
        answer = echo_completion(body, text=" 42")
        answer["choices"][0]["token_ids"] = [7, 9]
        answer["choices"][0]["logprobs"] = {
            "tokens": [" 4", "2"],
            "token_logprobs": [-0.1, -0.5],
            "top_logprobs": [{" 4": -0.1, " 5": -2.4}, {"3": -1.0, "2": -0.5}],
            "text_offset": [0, 2],
        }
        return answer

    with FakeOpenAIServer(responder) as server:
        outcome = _run(server.url + "/v1/completions", {"prompt": "p"})
        assert server.headers[0]["X-Request-ID"] == "tag-q00001"
    assert outcome.ok and outcome.text == " 42" and outcome.finish_reason == "stop"
    assert outcome.token_ids == (7, 9)
    assert (outcome.prompt_tokens, outcome.completion_tokens) == (10, 5)
    second = outcome.logprobs[1]
    assert (second.token, second.logprob, second.top) == ("2", -0.5, (("2", -0.5), ("3", -1.0)))
    assert second.top2_margin == pytest.approx(0.5)


def test_chat_answers_parse_message_content_and_logprobs():
    """Chat answers: text from message.content (null content is an empty answer), logprobs from content entries."""
    data = {
        "choices": [
            {
                "message": {"role": "assistant", "content": None, "reasoning_content": "hmm"},
                "finish_reason": "length",
                "logprobs": {
                    "content": [
                        {
                            "token": "a",
                            "logprob": -0.2,
                            "top_logprobs": [
                                {"token": "b", "logprob": -1.9},
                                {"token": "a", "logprob": -0.2},
                            ],
                        }
                    ]
                },
            }
        ],
    }
    fields, problem = parse_response(data, chat=True)
    assert problem is None and fields["text"] == "" and fields["finish_reason"] == "length"
    assert fields["logprobs"][0].top == (("a", -0.2), ("b", -1.9))
    assert (
        parse_response({"choices": [{"message": {}}]}, chat=True)[1]
        == "choices[0] has no message.content"
    )


def test_body_is_sent_as_json_and_nan_literals_in_answers_are_read():
    """The request is JSON with its content type; an answer with a NaN literal (Python servers write them) parses."""

    def responder(body):
        return web.Response(
            text='{"choices": [{"text": " 7", "logprobs": {"tokens": [" 7"], "token_logprobs": [NaN]}}]}',
            content_type="application/json",
        )

    body = {
        "model": "m",
        "prompt": "Question: \u00e9?\nAnswer:",
        "max_tokens": 5,
        "temperature": 0.0,
        "stop": ["Question"],
    }
    with FakeOpenAIServer(responder) as server:
        outcome = _run(server.url + "/v1/completions", body)
        assert server.requests == [body]
        assert server.headers[0]["Content-Type"] == "application/json"
    assert (
        outcome.ok
        and outcome.text == " 7"
        and outcome.logprobs[0].logprob != outcome.logprobs[0].logprob
    )


def test_latency_uses_the_injected_clock():
    """Latency is the injected clock's difference around the request (one tick per read here)."""
    ticks = iter(range(100))
    with FakeOpenAIServer() as server:
        outcome = _run(
            server.url + "/v1/completions", {"prompt": "p"}, now=lambda: float(next(ticks))
        )
    assert outcome.latency_s == 1.0


def test_base_url_accepts_the_usual_spellings():
    """Users pass the root, /v1 or the endpoint itself; all mean the same server."""
    for url in (
        "http://h:1",
        "http://h:1/",
        "http://h:1/v1",
        "http://h:1/v1/",
        "http://h:1/v1/completions",
    ):
        assert base_url(url) == "http://h:1"
