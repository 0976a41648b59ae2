"""Speed bar for the PD proxy: added p50 latency ≤ 1 ms over calling the decoder directly.

Side by side in one run, against instant fake backends (each in its own process, so no GIL
is shared with the client): an instant prefiller (returns kv_transfer_params) and an
instant decoder, the real proxy started as `pdcheck proxy`, and one aiohttp client.
  1. p50 latency of sequential requests: direct to the decoder vs through the proxy,
     interleaved in rounds so drift hits both alike;
  2. throughput at concurrency 64: direct vs through the proxy.
Prints a table, the ratios, and one JSON line. Usage: python benchmarks/bench_proxy.py [--requests N]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import statistics
import subprocess
import sys
import time
import urllib.request

import aiohttp
from aiohttp import web

from pdcheck.serving.ports import default_allocator

BAR_ADDED_P50_MS = 1.0


def _fake_backend(port: int) -> None:
    """An instant OpenAI-ish server: a fixed answer, with kv_transfer_params for prefill requests."""

    async def completions(request: web.Request) -> web.Response:
        body = await request.json()
        answer: dict[str, object] = {
            "choices": [{"index": 0, "text": " 42", "finish_reason": "length"}]
        }
        if (body.get("kv_transfer_params") or {}).get("do_remote_decode"):
            answer["kv_transfer_params"] = {"remote_engine_id": "bench", "remote_block_ids": [1]}
        return web.json_response(answer)

    async def health(request: web.Request) -> web.Response:
        return web.Response(text="ok")

    app = web.Application()
    app.router.add_post("/v1/completions", completions)
    app.router.add_get("/health", health)
    web.run_app(app, host="127.0.0.1", port=port, access_log=None, print=None)


def _wait_healthy(url: str, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url + "/health", timeout=1) as resp:
                if resp.status == 200:
                    return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"{url} did not become healthy")


BODY = {"model": "m", "prompt": "Question: 1+1?\nAnswer:", "max_tokens": 8, "temperature": 0}


async def _latencies(session: aiohttp.ClientSession, url: str, n: int) -> list[float]:
    out = []
    for i in range(n):
        t0 = time.perf_counter()
        async with session.post(
            url + "/v1/completions", json=BODY, headers={"X-Request-Id": f"bench-q{i:05d}"}
        ) as resp:
            await resp.read()
            assert resp.status == 200, resp.status
        out.append(time.perf_counter() - t0)
    return out


async def _throughput(session: aiohttp.ClientSession, url: str, n: int, concurrency: int) -> float:
    sem = asyncio.Semaphore(concurrency)

    async def one(i: int) -> None:
        async with (
            sem,
            session.post(
                url + "/v1/completions", json=BODY, headers={"X-Request-Id": f"tp-q{i:05d}"}
            ) as resp,
        ):
            await resp.read()
            assert resp.status == 200, resp.status

    t0 = time.perf_counter()
    await asyncio.gather(*(one(i) for i in range(n)))
    return n / (time.perf_counter() - t0)


async def _measure(
    direct: str, proxied: str, *, requests: int, rounds: int, concurrency: int
) -> dict:
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector) as session:
        await _latencies(session, direct, 50)  # warm up connections on both paths
        await _latencies(session, proxied, 50)
        lat: dict[str, list[float]] = {"direct": [], "proxy": []}
        for _ in range(rounds):
            lat["direct"] += await _latencies(session, direct, requests // rounds)
            lat["proxy"] += await _latencies(session, proxied, requests // rounds)
        tput: dict[str, list[float]] = {"direct": [], "proxy": []}
        for _ in range(3):
            tput["direct"].append(await _throughput(session, direct, 2000, concurrency))
            tput["proxy"].append(await _throughput(session, proxied, 2000, concurrency))
    p50 = {k: statistics.median(v) * 1e3 for k, v in lat.items()}
    best = {k: max(v) for k, v in tput.items()}
    return {
        "p50_direct_ms": round(p50["direct"], 3),
        "p50_proxy_ms": round(p50["proxy"], 3),
        "added_p50_ms": round(p50["proxy"] - p50["direct"], 3),
        "latency_ratio": round(p50["proxy"] / p50["direct"], 2),
        "rps_direct_c64": round(best["direct"], 1),
        "rps_proxy_c64": round(best["proxy"], 1),
        "throughput_ratio": round(best["proxy"] / best["direct"], 2),
        "requests": requests,
        "bar_added_p50_ms": BAR_ADDED_P50_MS,
    }


def _own_overhead_ms(proxy_url: str) -> float:
    """The proxy's own processing per request (excluding time waiting on either side), from its /metrics."""
    from pdcheck.serving.metrics import parse_prometheus

    with urllib.request.urlopen(proxy_url + "/metrics", timeout=10) as resp:
        samples = {name: value for name, _, value in parse_prometheus(resp.read().decode())}
    return round(
        1e3
        * samples["pdcheck_proxy_added_latency_seconds_sum"]
        / samples["pdcheck_proxy_added_latency_seconds_count"],
        3,
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--requests", type=int, default=2000, help="sequential requests per path for the p50"
    )
    parser.add_argument("--concurrency", type=int, default=64)
    args = parser.parse_args()
    ports = default_allocator()
    prefill_port, decode_port, proxy_port = ports.http_port(), ports.http_port(), ports.http_port()
    ctx = multiprocessing.get_context("spawn")
    backends = [
        ctx.Process(target=_fake_backend, args=(p,), daemon=True)
        for p in (prefill_port, decode_port)
    ]
    for b in backends:
        b.start()
    prefill, decode, proxied = (
        f"http://127.0.0.1:{p}" for p in (prefill_port, decode_port, proxy_port)
    )
    proxy = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "from pdcheck.cli import run; run()",
            "proxy",
            "--prefill",
            prefill,
            "--decode",
            decode,
            "--port",
            str(proxy_port),
        ],
        stderr=subprocess.DEVNULL,
    )
    try:
        for url in (prefill, decode, proxied):
            _wait_healthy(url)
        result = asyncio.run(
            _measure(
                decode, proxied, requests=args.requests, rounds=10, concurrency=args.concurrency
            )
        )
        result["proxy_own_mean_ms"] = _own_overhead_ms(proxied)
    finally:
        proxy.terminate()
        proxy.wait(10)
        for b in backends:
            b.terminate()
    print(
        f"p50 latency   direct {result['p50_direct_ms']:.3f} ms   via proxy {result['p50_proxy_ms']:.3f} ms   "
        f"added {result['added_p50_ms']:.3f} ms (bar ≤ {BAR_ADDED_P50_MS} ms)   ratio {result['latency_ratio']}x   "
        f"proxy's own processing {result['proxy_own_mean_ms']:.3f} ms/request (the rest is the two extra HTTP exchanges)"
    )
    print(
        f"throughput c{args.concurrency}   direct {result['rps_direct_c64']:.0f} req/s   via proxy {result['rps_proxy_c64']:.0f} req/s   "
        f"ratio {result['throughput_ratio']}x"
    )
    print(
        json.dumps({"bench": "proxy", **result, "pass": result["added_p50_ms"] <= BAR_ADDED_P50_MS})
    )
    return 0 if result["added_p50_ms"] <= BAR_ADDED_P50_MS else 1


if __name__ == "__main__":
    sys.exit(main())
