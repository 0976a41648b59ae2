"""The GPU tests' cells, and whether this machine's GPUs can run them (checked without a GPU too).

fp32 on GPU needs an attention backend that has it: vLLM casts an fp32 checkpoint to bf16
unless `--dtype float32` (config/model.py), and FlashAttention, the default, has no fp32
(v1/attention/backends/flash_attn.py); TRITON_ATTN does (triton_attn.py). In fp32 the tiny
model's greedy picks do not flip at near-ties, so PD and the baseline can be compared exactly.
"""

from __future__ import annotations

from pdcheck.config import Cell, expand_cells
from pdcheck.config.schema import SweepSpec
from pdcheck.serving.gpus import GpuInventory

FP32_ATTENTION_BACKEND = "TRITON_ATTN"


def gpu_pd_cell(decode_tp: int) -> Cell:
    """1P1D of the random tiny Llama in fp32, prefill at TP 1, decode (and baseline) at `decode_tp`."""
    spec = SweepSpec.model_validate(
        {
            "name": "gpu-test",
            "models": [
                {
                    "name": "llama",
                    "path": "fixture:tiny-llama-random",
                    "serve_args": [
                        "--dtype",
                        "float32",
                        "--max-model-len",
                        "2048",
                        "--enforce-eager",
                    ],
                }
            ],
            "matrix": {"decode_tp": [decode_tp], "attention_backend": [FP32_ATTENTION_BACKEND]},
            "serving": {"platform": "gpu", "ready_timeout_s": 600},
        }
    )
    return expand_cells(spec)[0]


def gpu_shortfall(cell: Cell, inventory: GpuInventory) -> str | None:
    """Why `cell` cannot run on `inventory` (a skip reason), or None when its servers fit.

    Servers share GPUs when there are fewer than they need together (each with a memory share,
    started one after another), so one GPU runs every TP 1 topology; a TP rank still needs a
    GPU of its own.
    """
    widest = max(cell.prefill_tp, cell.decode_tp)
    if widest <= inventory.count:
        return None
    return (
        f"needs {widest} GPUs for one server's TP ranks (prefill TP {cell.prefill_tp}, decode TP "
        f"{cell.decode_tp}); this machine has {inventory.count} ({inventory.source})"
    )
