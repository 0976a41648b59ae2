"""The few vLLM names that pdcheck's processes outside vLLM need, spelled once.

Everything else pdcheck knows of vLLM's insides lives in `pdcheck._vllm`, which only code that
runs in a vLLM process (or imports vLLM) may reach. These names cross a process boundary
instead: a command line that starts vLLM, and what a failed import of vLLM prints.
"""

from __future__ import annotations

# What `vllm serve` runs: the module a GPU server is started with (`python -m ... serve`).
CLI_MODULE = "vllm.entrypoints.cli.main"

# What a failed import prints when the checked-out Python expects compiled ops (vLLM's and
# torch's `_C` extensions) that the installed build lacks.
COMPILED_OPS_ERRORS = (
    "undefined symbol",
    "_C.abi3",
    "vllm._C",
    "has no attribute '_C'",
    "torch.ops._C",
)
