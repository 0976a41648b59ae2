"""The PD proxy against fake prefill/decode servers: protocol, relay, round-robin, failures, metrics."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request

import pytest
from aiohttp import web

from pdcheck.serving.proxy import (
    PREFILL_KV_PARAMS,
    PdProxy,
    ProxyServer,
    ProxyTimeouts,
    prefill_request,
)
from tests.fakes.openai_server import FakeOpenAIServer, echo_completion
from tests.unit.hung_server import hung_server


def prefiller(body):
    out = echo_completion(body, text="x")
    out["kv_transfer_params"] = {
        "remote_engine_id": "E1",
        "remote_block_ids": [1, 2],
        "remote_host": "127.0.0.1",
        "remote_port": 5559,
    }
    return out


def rid(headers: dict[str, str]) -> str:
    """The X-Request-Id a fake server saw (header names are case-insensitive)."""
    return {k.lower(): v for k, v in headers.items()}["x-request-id"]


def post(
    url: str,
    body: dict,
    *,
    path: str = "/v1/completions",
    request_id: str | None = "run-q00007",
    timeout: float = 10,
):
    headers = {"Content-Type": "application/json"}
    if request_id:
        headers["X-Request-Id"] = request_id
    req = urllib.request.Request(url + path, data=json.dumps(body).encode(), headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def test_nixl_protocol_on_both_sides():
    """Prefill copy: max_tokens=1, stream off, no stream_options/min_tokens, do_remote_decode; decode gets the prefiller's params."""
    with (
        FakeOpenAIServer(prefiller) as p,
        FakeOpenAIServer() as d,
        ProxyServer(PdProxy([p.url], [d.url])) as proxy,
    ):
        body = {
            "model": "m",
            "prompt": "Q",
            "max_tokens": 32,
            "min_tokens": 4,
            "stream": False,
            "stream_options": {"include_usage": True},
            "temperature": 0,
        }
        status, raw = post(proxy.url, body)
        assert (
            status == 200 and json.loads(raw)["choices"][0]["text"] == " The answer is 42.\n#### 42"
        )
        sent_p, sent_d = p.requests[0], d.requests[0]
        assert sent_p == {
            "model": "m",
            "prompt": "Q",
            "max_tokens": 1,
            "stream": False,
            "temperature": 0,
            "kv_transfer_params": PREFILL_KV_PARAMS,
        }
        assert sent_d == {**body, "kv_transfer_params": prefiller(body)["kv_transfer_params"]}
        assert rid(p.headers[0]) == rid(d.headers[0]) == "run-q00007"


def test_prefill_leg_drops_min_completion_tokens():
    """A chat request's min_completion_tokens cannot be met by a one-token prefill (vLLM's toy proxy
    drops it too); the decoder still gets it."""
    body = {
        "model": "m",
        "messages": [{"role": "user", "content": "Q"}],
        "max_completion_tokens": 32,
        "min_completion_tokens": 4,
    }
    req = prefill_request(body)
    assert (
        "min_completion_tokens" not in req
        and req["max_completion_tokens"] == 1
        and body["min_completion_tokens"] == 4
    )


def test_streaming_answer_is_relayed_byte_for_byte():
    """A streamed decoder answer reaches the client unchanged."""
    sse = (
        b'data: {"choices":[{"text":"a"}]}\n\ndata: {"choices":[{"text":"b"}]}\n\ndata: [DONE]\n\n'
    )
    streamer = lambda body: web.Response(body=sse, content_type="text/event-stream")  # noqa: E731
    with (
        FakeOpenAIServer(prefiller) as p,
        FakeOpenAIServer(streamer) as d,
        ProxyServer(PdProxy([p.url], [d.url])) as proxy,
    ):
        status, raw = post(proxy.url, {"prompt": "Q", "max_tokens": 8, "stream": True})
        assert status == 200 and raw == sse
        assert p.requests[0]["stream"] is False and d.requests[0]["stream"] is True


def test_round_robin_and_chat_path():
    """Prefillers and decoders alternate; /v1/chat/completions is forwarded to the same path."""
    with (
        FakeOpenAIServer(prefiller) as p1,
        FakeOpenAIServer(prefiller) as p2,
        FakeOpenAIServer() as d1,
        FakeOpenAIServer() as d2,
    ):
        with ProxyServer(PdProxy([p1.url, p2.url], [d1.url, d2.url])) as proxy:
            for i in range(4):
                assert (
                    post(
                        proxy.url,
                        {"messages": [], "max_completion_tokens": 5},
                        path="/v1/chat/completions",
                        request_id=f"r-q{i:05d}",
                    )[0]
                    == 200
                )
        assert [len(s.requests) for s in (p1, p2, d1, d2)] == [2, 2, 2, 2]
        assert (
            p1.requests[0]["max_completion_tokens"] == 1
            and d1.requests[0]["max_completion_tokens"] == 5
        )
        assert [rid(h) for h in d1.headers] == ["r-q00000", "r-q00002"]


def test_missing_request_id_gets_one_shared_by_both_sides():
    """Without X-Request-Id the proxy makes one and sends the same to prefiller and decoder."""
    with (
        FakeOpenAIServer(prefiller) as p,
        FakeOpenAIServer() as d,
        ProxyServer(PdProxy([p.url], [d.url])) as proxy,
    ):
        post(proxy.url, {"prompt": "Q"}, request_id=None)
        assert rid(p.headers[0]) == rid(d.headers[0])


@pytest.mark.parametrize(
    "case, side, reason",
    [
        ("prefill-500", "prefill", "HTTP 500"),
        ("prefill-no-params", "prefill", "no kv_transfer_params"),
        ("decode-down", "decode", "ClientConnectorError"),
        ("decode-400", "decode", "HTTP 400"),
    ],
)
def test_a_failing_side_gives_502_naming_it(case, side, reason):
    """Any failing side answers 502 with JSON {error: {side, url, reason}}, and is counted on /metrics."""
    bad_prefill = {
        "prefill-500": lambda b: web.json_response({"error": "boom"}, status=500),
        "prefill-no-params": echo_completion,
    }.get(case, prefiller)
    bad_decode = (
        (lambda b: web.json_response({"error": "bad"}, status=400))
        if case == "decode-400"
        else echo_completion
    )
    with FakeOpenAIServer(bad_prefill) as p, FakeOpenAIServer(bad_decode) as d:
        decode_url = "http://127.0.0.1:9" if case == "decode-down" else d.url
        with ProxyServer(PdProxy([p.url], [decode_url])) as proxy:
            status, raw = post(proxy.url, {"prompt": "Q"})
            metrics = urllib.request.urlopen(proxy.url + "/metrics").read().decode()
    error = json.loads(raw)["error"]
    assert status == 502 and error["side"] == side and reason in error["reason"]
    assert f'pdcheck_proxy_failures_total{{side="{side}"}} 1' in metrics


def test_a_hung_side_times_out_instead_of_hanging():
    """A prefiller that never answers gives a 502 after the prefill timeout, not a hang."""
    with hung_server(prefiller) as p, FakeOpenAIServer() as d:
        with ProxyServer(PdProxy([p.url], [d.url], timeouts=ProxyTimeouts(prefill_s=0.2))) as proxy:
            t0 = time.monotonic()
            status, raw = post(proxy.url, {"prompt": "Q"})
            elapsed = time.monotonic() - t0
            still_hung = p.in_flight == 1
    assert status == 502 and "within 0.2 s" in json.loads(raw)["error"]["reason"]
    assert 0.2 <= elapsed < 2 and still_hung


def test_health_reports_backends_and_metrics_count_requests():
    """/health is 200 only while every backend is healthy; /metrics counts requests and added latency."""
    with (
        FakeOpenAIServer(prefiller) as p,
        FakeOpenAIServer() as d,
        ProxyServer(PdProxy([p.url], [d.url])) as proxy,
    ):
        for _ in range(3):
            post(proxy.url, {"prompt": "Q"})
        assert urllib.request.urlopen(proxy.url + "/health").status == 200
        metrics = urllib.request.urlopen(proxy.url + "/metrics").read().decode()
        assert (
            "pdcheck_proxy_requests_total 3" in metrics
            and "pdcheck_proxy_added_latency_seconds_count 3" in metrics
        )
        d.healthy = False
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(proxy.url + "/health")
        assert err.value.code == 503 and d.url in json.loads(err.value.read())["down"]


def test_proxy_on_a_taken_port_raises_port_unavailable():
    """Starting the in-process proxy on a port someone holds raises PortUnavailable naming it."""
    import socket

    from pdcheck.errors import PortUnavailable

    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        with pytest.raises(PortUnavailable, match=f"127.0.0.1:{port}"):
            ProxyServer(PdProxy(["http://127.0.0.1:1"], ["http://127.0.0.1:2"]), port=port).start()


def test_proxy_binds_loopback_by_default():
    """Without an explicit host the proxy listens on 127.0.0.1 only."""
    with FakeOpenAIServer(prefiller) as p, ProxyServer(PdProxy([p.url], [p.url])) as proxy:
        assert proxy.url.startswith("http://127.0.0.1:")
