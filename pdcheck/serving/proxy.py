"""The PD proxy: vLLM's NIXL prefill/decode protocol behind one OpenAI-compatible endpoint.

Per request: a copy goes to a prefiller with `max_tokens=1`, `stream=false`, no
`stream_options`/`min_tokens`/`min_completion_tokens`, and `kv_transfer_params={"do_remote_decode": true, ...}`;
the prefiller's `kv_transfer_params` then ride on the original request to a decoder, whose
answer (streamed or not) is relayed. Both sides get the same `X-Request-Id`; prefillers and
decoders are picked round-robin. A failing side gives a 502 whose JSON names the side and
why; each side has its own timeout, so the proxy never hangs.

The proxy adds two HTTP exchanges to every request; it runs on uvloop (as vLLM's API server
does), which takes about 50 µs off the added p50 (benchmarks/bench_proxy.py).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import threading
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import uvloop
from aiohttp import web

from pdcheck.errors import PortUnavailable

log = logging.getLogger(__name__)

PREFILL_KV_PARAMS: dict[str, Any] = {
    "do_remote_decode": True,
    "do_remote_prefill": False,
    "remote_engine_id": None,
    "remote_block_ids": None,
    "remote_host": None,
    "remote_port": None,
}
_ERROR_BODY_CHARS = 500


@dataclass(frozen=True)
class ProxyTimeouts:
    """Per-side limits: connecting, and the whole call (a decode of 256 tokens on CPU takes a while)."""

    connect_s: float = 10.0
    prefill_s: float = 300.0
    decode_s: float = 900.0


@dataclass
class ProxyStats:
    """Counters the proxy exposes on /metrics; `overhead_s` is time not spent waiting on a side."""

    requests: int = 0
    failures: dict[str, int] = field(default_factory=lambda: {"prefill": 0, "decode": 0})
    overhead_s_sum: float = 0.0
    prefill_s_sum: float = 0.0
    decode_s_sum: float = 0.0
    completed: int = 0

    def render(self) -> str:
        lines = [
            "# TYPE pdcheck_proxy_requests_total counter",
            f"pdcheck_proxy_requests_total {self.requests}",
            "# TYPE pdcheck_proxy_failures_total counter",
            *(
                f'pdcheck_proxy_failures_total{{side="{side}"}} {n}'
                for side, n in self.failures.items()
            ),
            "# TYPE pdcheck_proxy_added_latency_seconds summary",
            f"pdcheck_proxy_added_latency_seconds_sum {self.overhead_s_sum:.6f}",
            f"pdcheck_proxy_added_latency_seconds_count {self.completed}",
            f"pdcheck_proxy_prefill_seconds_sum {self.prefill_s_sum:.6f}",
            f"pdcheck_proxy_decode_seconds_sum {self.decode_s_sum:.6f}",
        ]
        return "\n".join(lines) + "\n"


class SideFailed(Exception):
    def __init__(self, side: str, url: str, reason: str, status: int | None = None):
        super().__init__(f"{side} {url}: {reason}")
        self.side, self.url, self.reason, self.status = side, url, reason, status

    def response(self) -> web.Response:
        error = {"side": self.side, "url": self.url, "reason": self.reason, "status": self.status}
        return web.json_response({"error": error}, status=502)


def prefill_request(body: dict[str, Any]) -> dict[str, Any]:
    """The prefiller's copy of a request: one token, not streamed, asking for remote decode."""
    req = dict(body)
    req["max_tokens"] = 1
    if "max_completion_tokens" in req:
        req["max_completion_tokens"] = 1
    req["stream"] = False
    req.pop("stream_options", None)
    # A one-token prefill cannot honour a minimum length; vLLM's toy proxy drops both.
    req.pop("min_tokens", None)
    req.pop("min_completion_tokens", None)
    req["kv_transfer_params"] = dict(PREFILL_KV_PARAMS)
    return req


class PdProxy:
    """The aiohttp application; `app()` for embedding, or `ProxyServer` to run it."""

    def __init__(
        self,
        prefill_urls: Sequence[str],
        decode_urls: Sequence[str],
        *,
        timeouts: ProxyTimeouts = ProxyTimeouts(),
    ):
        if not prefill_urls or not decode_urls:
            raise ValueError("the proxy needs at least one prefill URL and one decode URL")
        self.prefill_urls = [u.rstrip("/") for u in prefill_urls]
        self.decode_urls = [u.rstrip("/") for u in decode_urls]
        self.timeouts = timeouts
        self.stats = ProxyStats()
        self._prefills = itertools.cycle(self.prefill_urls)
        self._decodes = itertools.cycle(self.decode_urls)
        self._session: aiohttp.ClientSession | None = None

    def app(self) -> web.Application:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_post("/v1/completions", self._handle)
        app.router.add_post("/v1/chat/completions", self._handle)
        app.router.add_get("/health", self._health)
        app.router.add_get("/metrics", self._metrics)
        app.on_startup.append(self._open)
        app.on_cleanup.append(self._close)
        return app

    async def _open(self, app: web.Application) -> None:
        connector = aiohttp.TCPConnector(limit=0, force_close=False)
        self._session = aiohttp.ClientSession(connector=connector)

    async def _close(self, app: web.Application) -> None:
        if self._session is not None:
            await self._session.close()

    def _timeout(self, total_s: float) -> aiohttp.ClientTimeout:
        return aiohttp.ClientTimeout(total=total_s, sock_connect=self.timeouts.connect_s)

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        t0 = time.perf_counter()
        self.stats.requests += 1
        try:
            body = await request.json()
        except ValueError:
            return web.json_response(
                {"error": {"side": "proxy", "reason": "request body is not JSON"}}, status=400
            )
        request_id = request.headers.get("X-Request-Id") or f"pdcheck-{uuid.uuid4().hex}"
        headers = {"X-Request-Id": request_id}
        prefill_url = next(self._prefills) + request.path
        decode_url = next(self._decodes) + request.path
        try:
            kv_params, prefill_s = await self._prefill(prefill_url, body, headers)
            decode_body = dict(body)
            decode_body["kv_transfer_params"] = kv_params
            response, decode_s = await self._decode(request, decode_url, decode_body, headers)
        except SideFailed as exc:
            self.stats.failures[exc.side] += 1
            log.warning("PD request %s failed: %s", request_id, exc)
            return exc.response()
        self.stats.completed += 1
        self.stats.prefill_s_sum += prefill_s
        self.stats.decode_s_sum += decode_s
        self.stats.overhead_s_sum += max(0.0, time.perf_counter() - t0 - prefill_s - decode_s)
        return response

    async def _prefill(
        self, url: str, body: dict[str, Any], headers: dict[str, str]
    ) -> tuple[Any, float]:
        assert self._session is not None
        t0 = time.perf_counter()
        try:
            async with self._session.post(
                url,
                json=prefill_request(body),
                headers=headers,
                timeout=self._timeout(self.timeouts.prefill_s),
            ) as resp:
                if resp.status != 200:
                    text = (await resp.text())[:_ERROR_BODY_CHARS]
                    raise SideFailed("prefill", url, f"HTTP {resp.status}: {text}", resp.status)
                data = await resp.json(content_type=None)
        except TimeoutError:
            raise SideFailed(
                "prefill", url, f"no answer within {self.timeouts.prefill_s:g} s"
            ) from None
        except (aiohttp.ClientError, ValueError) as exc:
            raise SideFailed("prefill", url, f"{type(exc).__name__}: {exc}") from None
        params = data.get("kv_transfer_params") if isinstance(data, dict) else None
        if not params:
            raise SideFailed(
                "prefill",
                url,
                "the answer has no kv_transfer_params; is the server a KV producer (--kv-transfer-config)?",
                200,
            )
        return params, time.perf_counter() - t0

    async def _decode(
        self, request: web.Request, url: str, body: dict[str, Any], headers: dict[str, str]
    ) -> tuple[web.StreamResponse, float]:
        assert self._session is not None
        t0 = time.perf_counter()
        try:
            async with self._session.post(
                url, json=body, headers=headers, timeout=self._timeout(self.timeouts.decode_s)
            ) as resp:
                if resp.status != 200:
                    text = (await resp.text())[:_ERROR_BODY_CHARS]
                    raise SideFailed("decode", url, f"HTTP {resp.status}: {text}", resp.status)
                if not body.get("stream"):
                    payload = await resp.read()
                    out = web.Response(body=payload, status=200, content_type="application/json")
                    return out, time.perf_counter() - t0
                stream = web.StreamResponse(
                    status=200,
                    headers={"Content-Type": resp.headers.get("Content-Type", "text/event-stream")},
                )
                await stream.prepare(request)
                try:
                    async for chunk in resp.content.iter_any():
                        await stream.write(chunk)
                except (TimeoutError, aiohttp.ClientError) as exc:
                    # The 200 is already sent: the client sees a truncated stream with no [DONE].
                    self.stats.failures["decode"] += 1
                    log.warning("decoder %s failed mid-stream: %s", url, exc)
                    return stream, time.perf_counter() - t0
                await stream.write_eof()
                return stream, time.perf_counter() - t0
        except TimeoutError:
            raise SideFailed(
                "decode", url, f"no answer within {self.timeouts.decode_s:g} s"
            ) from None
        except aiohttp.ClientError as exc:
            raise SideFailed("decode", url, f"{type(exc).__name__}: {exc}") from None

    async def _health(self, request: web.Request) -> web.Response:
        """200 when every prefiller and decoder answers its own /health, else 503 naming the ones down."""
        assert self._session is not None
        urls = [*self.prefill_urls, *self.decode_urls]
        results = await asyncio.gather(*(self._backend_ok(u) for u in urls))
        down = [u for u, ok in zip(urls, results, strict=True) if not ok]
        return web.json_response({"ok": not down, "down": down}, status=503 if down else 200)

    async def _backend_ok(self, url: str) -> bool:
        assert self._session is not None
        try:
            async with self._session.get(f"{url}/health", timeout=self._timeout(5.0)) as resp:
                return resp.status == 200
        except (TimeoutError, aiohttp.ClientError):
            return False

    async def _metrics(self, request: web.Request) -> web.Response:
        return web.Response(text=self.stats.render(), content_type="text/plain")


class ProxyServer:
    """Runs a `PdProxy` on its own event loop in a thread (for sweeps and tests); a context manager."""

    def __init__(self, proxy: PdProxy, *, host: str = "127.0.0.1", port: int = 0):
        self.proxy = proxy
        self.host = host
        self.port = port
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self._error: BaseException | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self) -> ProxyServer:
        self._thread = threading.Thread(target=self._serve, name="pdcheck-proxy", daemon=True)
        self._thread.start()
        self._ready.wait(30)
        if isinstance(self._error, OSError):
            raise PortUnavailable(
                f"the PD proxy could not listen on {self.host}:{self.port}: {self._error}"
            ) from self._error
        if self._error is not None:
            raise self._error
        return self

    def _serve(self) -> None:
        loop = self._loop = uvloop.new_event_loop()
        asyncio.set_event_loop(loop)
        runner = web.AppRunner(self.proxy.app(), access_log=None)
        try:
            loop.run_until_complete(runner.setup())
            site = web.TCPSite(runner, self.host, self.port)
            loop.run_until_complete(site.start())
            self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        except BaseException as exc:  # reported to the starting thread
            self._error = exc
            self._ready.set()
            loop.run_until_complete(runner.cleanup())
            loop.close()
            return
        self._ready.set()
        loop.run_forever()
        loop.run_until_complete(runner.cleanup())
        loop.close()

    def stop(self) -> None:
        if self._loop is not None and self._loop.is_running():
            self._loop.call_soon_threadsafe(self._loop.stop)
        if self._thread is not None:
            self._thread.join(10)

    def __enter__(self) -> ProxyServer:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def run_proxy(
    prefill_urls: Sequence[str],
    decode_urls: Sequence[str],
    *,
    host: str = "127.0.0.1",
    port: int = 8000,
    timeouts: ProxyTimeouts = ProxyTimeouts(),
) -> None:
    """Serve the proxy in the foreground until interrupted (`pdcheck proxy`)."""
    proxy = PdProxy(prefill_urls, decode_urls, timeouts=timeouts)
    web.run_app(
        proxy.app(), host=host, port=port, access_log=None, print=None, loop=uvloop.new_event_loop()
    )
