"""`check_serve_argv` runs vLLM's own parser in a subprocess: GPU-shaped command lines check on a CPU box.

One vLLM import in a child python (~10-20 s); no server, no GPU.
"""

from __future__ import annotations

import sys

import pytest

from pdcheck.serving import build_serve_argv
from pdcheck.serving.argcheck import check_serve_argvs
from pdcheck.serving.argv import apply_overrides
from tests.unit.serving.conftest import make_cell

pytestmark = pytest.mark.vllm


def test_gpu_topology_argv_parses_and_a_bad_value_is_named():
    """A TP-2 NIXL decode argv (as a GPU run builds it) parses cleanly; a bad TP value is reported by vLLM's parser."""
    cell = make_cell(
        model={
            "path": "Qwen/Qwen3-0.6B",
            "serve_args": ["--block-size", "128", "--gpu-memory-utilization", "0.2"],
        },
        matrix={
            "prefill_tp": [2],
            "decode_tp": [2],
            "async_scheduling": [False],
            "attention_backend": ["FLASH_ATTN"],
        },
        serving={"platform": "gpu"},
    )
    good = build_serve_argv(cell, role="decode", port=8200, platform="gpu")
    bad = apply_overrides(good, ["--tensor-parallel-size", "two"])
    problems = check_serve_argvs([good, bad], sys.executable)
    assert problems[0] == []
    assert (
        len(problems[1]) == 1
        and "--tensor-parallel-size" in problems[1][0]
        and "'two'" in problems[1][0]
    )
