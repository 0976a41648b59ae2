"""Real PD on NVIDIA GPUs, through the same code path as the CPU tests: the tiny Llama as a
no-PD baseline plus 1P1D, then 1P at TP 1 with a TP-2 decoder when 2 GPUs are there.

Pins what only a GPU can show: the servers start and serve on their CUDA_VISIBLE_DEVICES sets
(on GPUs of their own, or sharing them with a memory share each and one start after another
when there are fewer GPUs than servers: all three on GPU 0 of a one-GPU box), greedy outputs
through PD equal the baseline's at concurrency 4 (fp32 with TRITON_ATTN, see
tests/gpu/cells.py), and the decoder received KV. Skipped when no GPU is present
(tests/conftest.py); the decode TP 2 case is skipped with the counts on a one-GPU box, since
each TP rank needs a GPU of its own.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import pytest

from pdcheck.config.paths import fixture_models_dir
from pdcheck.serving import plan_topology, scrape_kv_metrics, serve_topology
from pdcheck.serving.gpus import read_inventory
from pdcheck.serving.ports import default_allocator
from tests.gpu.cells import gpu_pd_cell, gpu_shortfall
from tests.integration.conftest import greedy_token_ids

pytestmark = [pytest.mark.gpu, pytest.mark.servers, pytest.mark.xdist_group("servers")]


@pytest.mark.parametrize("decode_tp", [1, 2])
def test_gpu_pd_equals_baseline_with_disjoint_gpu_sets(decode_tp, gsm8k_dir):
    """PD greedy token ids == baseline's for 20 GSM8K prompts; KV arrived at the decoder."""
    inventory = read_inventory()
    cell = gpu_pd_cell(decode_tp)
    if (shortfall := gpu_shortfall(cell, inventory)) is not None:
        pytest.skip(shortfall)
    assert (fixture_models_dir() / "tiny-llama-random" / "config.json").is_file(), (
        "run `pdcheck fixtures tiny-models`"
    )
    with open(f"{gsm8k_dir}/test.jsonl") as f:
        prompts = [
            f"Question: {json.loads(line)['question']}\nAnswer:"
            for _, line in zip(range(20), f, strict=False)
        ]
    plan = plan_topology(
        cell,
        inventory=inventory,
        ports=default_allocator(),
        run_dir=Path(tempfile.mkdtemp(prefix="pdcheck-gpu-")),
    )
    model = str(fixture_models_dir() / "tiny-llama-random")
    with serve_topology(plan) as ep:
        before = scrape_kv_metrics(ep.decoder_metrics_urls[0])
        base = greedy_token_ids(ep.baseline_url, prompts, model=model, tag="base", concurrency=4)
        pd = greedy_token_ids(ep.pd_url, prompts, model=model, tag="pd", concurrency=4)
        delta = scrape_kv_metrics(ep.decoder_metrics_urls[0]).minus(before)
    assert delta.external_kv_tokens > 0, f"decode-0: PD bypassed, {delta}"
    assert pd == base
