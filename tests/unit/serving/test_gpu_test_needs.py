"""The GPU test's own rules, checked on a machine without GPUs with a simulated inventory:
it runs on one GPU (its servers sharing it), skips with the counts only where a server's TP
ranks outnumber the GPUs, and runs fp32 on an attention backend that has fp32."""

from __future__ import annotations

import pytest

from pdcheck.serving.argv import build_serve_argv
from tests.fakes.nvidia_smi import fake_inventory
from tests.gpu.cells import gpu_pd_cell, gpu_shortfall


@pytest.mark.parametrize(("decode_tp", "needed"), [(1, 1), (2, 2)])
@pytest.mark.parametrize("gpus", [1, 2, 3, 4, 5, 8])
def test_gpu_test_skips_with_the_counts_only_when_a_server_is_wider_than_the_gpus(
    decode_tp, needed, gpus
):
    """One GPU runs the TP 1 topology (servers share it); TP 2 needs 2 GPUs, else a skip that
    says how many it needs and how many there are."""
    inventory = fake_inventory(gpus)
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
