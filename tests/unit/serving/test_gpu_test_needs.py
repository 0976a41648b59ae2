"""The GPU test's own rules, checked on a machine without GPUs through a simulated nvidia-smi:
it skips (with the counts) where its topology does not fit, and runs fp32 on an attention
backend that has fp32."""

from __future__ import annotations

import pytest

from pdcheck.serving.argv import build_serve_argv
from pdcheck.serving.gpus import read_inventory
from tests.fakes.nvidia_smi import fake_nvidia_smi
from tests.gpu.cells import gpu_pd_cell, gpu_shortfall


@pytest.mark.parametrize(("decode_tp", "needed"), [(1, 3), (2, 5)])
@pytest.mark.parametrize("gpus", [1, 2, 3, 4, 5, 8])
def test_gpu_test_skips_with_the_counts_when_too_few_gpus(tmp_path, decode_tp, needed, gpus):
    inventory = read_inventory(env={}, nvidia_smi=fake_nvidia_smi(tmp_path, gpus))
    shortfall = gpu_shortfall(gpu_pd_cell(decode_tp), inventory)
    if gpus >= needed:
        assert shortfall is None
    else:
        assert (
            shortfall is not None
            and f"needs {needed} GPUs" in shortfall
            and f"has {gpus}" in shortfall
        )


def test_gpu_test_runs_fp32_on_an_attention_backend_with_fp32():
    argv = build_serve_argv(
        gpu_pd_cell(1), role="decode", port=1, platform="gpu", launcher=["vllm"]
    )
    assert argv[argv.index("--dtype") + 1] == "float32"
    assert argv[argv.index("--attention-backend") + 1] == "TRITON_ATTN"
