"""One OpenAI-compatible completion request, as data in and data out.

`complete()` never raises for a failure of the request itself: a timeout, a refused
connection, an HTTP error, a body that is not JSON or lacks the fields we need all give an
`Outcome` with `ok=False` and the reason, so the runner records an error and never scores a
failed request as a wrong answer (lm-eval turns such failures into ""). Only connection errors
are retried (the request may never have reached the server); an HTTP answer, even a 5xx, is
the server's answer and is recorded as it is.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import aiohttp
import msgspec

from pdcheck.errors import InfraError
from pdcheck.evals.records import TokenLogprobs

logger = logging.getLogger(__name__)

_ERROR_BODY_CHARS = 300
# msgspec (which vLLM brings) encodes a 5-shot body and decodes an answer several times faster
# than the json module; on a fast server JSON is a large part of the client's time per question.
_encode_body = msgspec.json.Encoder().encode
_decode_answer = msgspec.json.Decoder().decode


@dataclass(frozen=True)
class CompletionRequest:
    """A request to send: the full endpoint URL, the JSON body, and the X-Request-Id to tag it with."""

    url: str
    body: dict[str, Any]
    request_id: str | None = None

    @property
    def chat(self) -> bool:
        return "messages" in self.body


@dataclass(frozen=True)
class Outcome:
    """What came back; when `ok` is False, `error` says why and the answer fields are None."""

    ok: bool
    error: str | None = None
    http_status: int | None = None
    attempts: int = 1
    latency_s: float | None = None
    text: str | None = None
    finish_reason: str | None = None
    token_ids: tuple[int, ...] | None = None
    logprobs: tuple[TokenLogprobs, ...] | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None


async def complete(
    session: aiohttp.ClientSession,
    request: CompletionRequest,
    *,
    timeout_s: float | None = None,
    max_attempts: int = 3,
    retry_delay_s: float = 0.2,
    now: Callable[[], float] = time.perf_counter,
) -> Outcome:
    """Send one request; returns an Outcome and never raises for a per-request failure."""
    headers = {"Content-Type": "application/json"}
    if request.request_id:
        headers["X-Request-Id"] = request.request_id
    body = _encode_body(request.body)
    timeout = _client_timeout(timeout_s)
    attempt = 0
    while True:
        attempt += 1
        start = now()
        try:
            async with session.post(
                request.url, data=body, headers=headers, timeout=timeout
            ) as resp:
                status = resp.status
                raw = await resp.read()
        except TimeoutError:
            return Outcome(
                ok=False,
                error=f"timed out after {timeout_s:g} s",
                attempts=attempt,
                latency_s=now() - start,
            )
        except aiohttp.ClientConnectionError as exc:
            if attempt < max_attempts:
                logger.debug(
                    "connection error on %s (attempt %d): %s", request.request_id, attempt, exc
                )
                await asyncio.sleep(retry_delay_s * attempt)
                continue
            return Outcome(
                ok=False, error=f"connection error: {type(exc).__name__}: {exc}", attempts=attempt
            )
        except aiohttp.ClientError as exc:
            return Outcome(
                ok=False,
                error=f"{type(exc).__name__}: {exc}",
                attempts=attempt,
                latency_s=now() - start,
            )
        latency_s = now() - start
        break
    if status >= 400:
        snippet = raw[:_ERROR_BODY_CHARS].decode("utf-8", "replace")
        return Outcome(
            ok=False,
            error=f"HTTP {status}: {snippet}",
            http_status=status,
            attempts=attempt,
            latency_s=latency_s,
        )
    try:
        data = _parse_json(raw)
    except ValueError:
        snippet = raw[:_ERROR_BODY_CHARS].decode("utf-8", "replace")
        return Outcome(
            ok=False,
            error=f"response is not JSON: {snippet!r}",
            http_status=status,
            attempts=attempt,
            latency_s=latency_s,
        )
    fields, problem = parse_response(data, chat=request.chat)
    if problem is not None:
        return Outcome(
            ok=False, error=problem, http_status=status, attempts=attempt, latency_s=latency_s
        )
    return Outcome(ok=True, http_status=status, attempts=attempt, latency_s=latency_s, **fields)


def _parse_json(raw: bytes) -> Any:
    try:
        return _decode_answer(raw)
    except msgspec.DecodeError:
        # What msgspec refuses but Python's json reads (NaN and Infinity literals, UTF-16 or
        # UTF-32 bodies) is still an answer; json raises ValueError for real garbage.
        return json.loads(raw)


@functools.lru_cache(maxsize=8)
def _client_timeout(timeout_s: float | None) -> aiohttp.ClientTimeout | None:
    """One ClientTimeout per value, not one per request (a run asks thousands with the same one)."""
    return aiohttp.ClientTimeout(total=timeout_s) if timeout_s is not None else None


def parse_response(data: Any, *, chat: bool) -> tuple[dict[str, Any], str | None]:
    """The Outcome fields from a completions or chat answer, or the reason it is unusable."""
    if not isinstance(data, dict):
        return {}, f"response is JSON but not an object: {type(data).__name__}"
    choices = data.get("choices")
    if not isinstance(choices, list) or not choices:
        return {}, "response has no choices"
    choice = choices[0]
    if not isinstance(choice, dict):
        return {}, "choices[0] is not an object"
    if chat:
        message = choice.get("message")
        if not isinstance(message, dict) or "content" not in message:
            return {}, "choices[0] has no message.content"
        # null content is a real answer from a thinking model cut off before its final text.
        text = message["content"] or ""
    else:
        text = choice.get("text")
        if not isinstance(text, str):
            return {}, "choices[0] has no text"
    usage = data.get("usage")
    if not isinstance(usage, dict):
        usage = {}
    token_ids = choice.get("token_ids")
    try:
        logprobs = (
            _chat_logprobs(choice.get("logprobs"))
            if chat
            else _completion_logprobs(choice.get("logprobs"))
        )
    except (KeyError, TypeError, ValueError) as exc:
        return {}, f"choices[0].logprobs is malformed: {type(exc).__name__}: {exc}"
    return {
        "text": text,
        "finish_reason": choice.get("finish_reason"),
        "token_ids": tuple(token_ids) if isinstance(token_ids, list) else None,
        "logprobs": logprobs,
        "prompt_tokens": usage.get("prompt_tokens"),
        "completion_tokens": usage.get("completion_tokens"),
    }, None


def _ranked(pairs: list[tuple[str, float]]) -> tuple[tuple[str, float], ...]:
    return tuple(sorted(pairs, key=lambda p: p[1], reverse=True))


def _completion_logprobs(lp: Any) -> tuple[TokenLogprobs, ...] | None:
    """/v1/completions logprobs: parallel lists `tokens`, `token_logprobs`, `top_logprobs`."""
    if not isinstance(lp, dict) or not isinstance(lp.get("tokens"), list):
        return None
    tops = lp.get("top_logprobs") or [None] * len(lp["tokens"])
    return tuple(
        TokenLogprobs(
            token,
            float(logprob) if logprob is not None else None,
            _ranked(list((top or {}).items())),
        )
        for token, logprob, top in zip(
            lp["tokens"], lp.get("token_logprobs") or [], tops, strict=False
        )
    )


def _chat_logprobs(lp: Any) -> tuple[TokenLogprobs, ...] | None:
    """/v1/chat/completions logprobs: `content` entries with their own `top_logprobs`."""
    if not isinstance(lp, dict) or not isinstance(lp.get("content"), list):
        return None
    return tuple(
        TokenLogprobs(
            entry["token"],
            float(entry["logprob"]),
            _ranked([(t["token"], float(t["logprob"])) for t in entry.get("top_logprobs") or []]),
        )
        for entry in lp["content"]
    )


async def fetch_model_name(
    session: aiohttp.ClientSession, base_url: str, *, timeout_s: float = 30.0
) -> str:
    """The first model id the server lists at /v1/models; InfraError if it lists none or cannot answer."""
    url = f"{base_url}/v1/models"
    try:
        async with session.get(url, timeout=aiohttp.ClientTimeout(total=timeout_s)) as resp:
            status = resp.status
            raw = await resp.read()
    except (TimeoutError, aiohttp.ClientError) as exc:
        raise InfraError(
            f"could not ask {url} for the model name ({type(exc).__name__}: {exc}); pass --model"
        ) from exc
    try:
        return str(json.loads(raw)["data"][0]["id"])
    except (ValueError, KeyError, IndexError, TypeError):
        raise InfraError(
            f"{url} answered HTTP {status} without a model id: {raw[:_ERROR_BODY_CHARS]!r}; pass --model"
        ) from None


def base_url(url: str) -> str:
    """The server root from a URL the user gave: trailing '/', '/v1' and endpoint paths are dropped."""
    url = url.rstrip("/")
    for suffix in ("/v1/completions", "/v1/chat/completions", "/v1"):
        if url.endswith(suffix):
            return url[: -len(suffix)]
    return url
