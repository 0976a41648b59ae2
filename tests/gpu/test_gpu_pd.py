"""Real PD on NVIDIA GPUs, through the same code path as the CPU tests: the tiny Llama as a
no-PD baseline plus 1P1D, then 1P at TP 1 with a TP-2 decoder when 4 GPUs are there.

Pins what only a GPU can show: disjoint CUDA_VISIBLE_DEVICES sets start and serve, greedy
outputs through PD equal the baseline's at concurrency 4, and the decoder received KV.
Skipped only when no GPU is present (tests/conftest.py).
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import pytest

from pdcheck.config import expand_cells
from pdcheck.config.paths import fixture_models_dir
from pdcheck.config.schema import SweepSpec
from pdcheck.serving import plan_topology, require_kv_transferred, scrape_kv_metrics, serve_topology
from pdcheck.serving.gpus import read_inventory
from pdcheck.serving.ports import default_allocator

from tests.integration.conftest import greedy_token_ids

pytestmark = [pytest.mark.gpu, pytest.mark.servers, pytest.mark.xdist_group("servers")]


@pytest.mark.parametrize("decode_tp", [1, 2])
def test_gpu_pd_equals_baseline_with_disjoint_gpu_sets(decode_tp, gsm8k_dir):
    """PD greedy token ids == baseline's for 20 GSM8K prompts; KV arrived at the decoder."""
    inventory = read_inventory()
    spec = SweepSpec.model_validate({
        "name": "gpu-test",
        "models": [{"name": "llama", "path": "fixture:tiny-llama-random",
                    "serve_args": ["--max-model-len", "2048", "--enforce-eager", "--gpu-memory-utilization", "0.2"]}],
        "matrix": {"decode_tp": [decode_tp]},
        "serving": {"platform": "gpu", "ready_timeout_s": 600},
    })
    cell = expand_cells(spec)[0]
    if cell.gpus_needed > inventory.count:
        pytest.fail(f"this test needs {cell.gpus_needed} GPUs; {inventory.count} present")
    assert (fixture_models_dir() / "tiny-llama-random" / "config.json").is_file(), "run `pdcheck fixtures tiny-models`"
    with open(f"{gsm8k_dir}/test.jsonl") as f:
        prompts = [f"Question: {json.loads(line)['question']}\nAnswer:" for _, line in zip(range(20), f)]
    plan = plan_topology(cell, inventory=inventory, ports=default_allocator(),
                         run_dir=Path(tempfile.mkdtemp(prefix="pdcheck-gpu-")))
    model = str(fixture_models_dir() / "tiny-llama-random")
    with serve_topology(plan) as ep:
        before = scrape_kv_metrics(ep.decoder_metrics_urls[0])
        base = greedy_token_ids(ep.baseline_url, prompts, model=model, tag="base", concurrency=4)
        pd = greedy_token_ids(ep.pd_url, prompts, model=model, tag="pd", concurrency=4)
        require_kv_transferred(scrape_kv_metrics(ep.decoder_metrics_urls[0]).minus(before), where="decode-0")
    assert pd == base
