"""Every environment variable pdcheck sets on a server or reads itself, in the style of
vLLM's `envs.py`: its name, who reads it, whether it is read only after a CPU fork server's
fork, and what it changes in vLLM's behaviour.

Serving sets the variables, the plugin and the launcher read them, the fork server's sharing
rule is derived from `read_after_fork`, and the report's environment section names what
`tunes` says. A name is spelled here and nowhere else (tests/unit/test_architecture.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class Reader(StrEnum):
    """The process that reads a variable."""

    PLUGIN = "pdcheck's vLLM plugin, in every vLLM process it activates in"
    LAUNCHER = "pdcheck's launcher (python -m pdcheck._vllm.launch)"
    VLLM = "vLLM, through vllm.envs once its engine is set up"
    UCX = "UCX, under NIXL"
    PDCHECK = "pdcheck itself"


@dataclass(frozen=True)
class EnvVar:
    name: str
    reader: Reader
    # True: read only after argument parsing, never during vLLM's import, so servers that
    # differ in it can be forked from one import.
    read_after_fork: bool
    # What setting it changes in how vLLM runs, as a report names it; None: nothing.
    tunes: str | None = None
    # False for a value that means nothing to a reader of the report (a socket path).
    value_in_report: bool = True


# pdcheck's namespace: nothing in vLLM's import reads a PDCHECK_ variable.
PREFIX = "PDCHECK_"

DISABLE_FIXES = EnvVar(
    "PDCHECK_DISABLE_FIXES", Reader.PLUGIN, True, "race fixes switched off in the scheduler"
)
INJECT = EnvVar(
    "PDCHECK_INJECT", Reader.PLUGIN, True, "faults written into the decoder's loaded KV"
)
INJECT_SEED = EnvVar("PDCHECK_INJECT_SEED", Reader.PLUGIN, True)
TRACE_DIR = EnvVar("PDCHECK_TRACE_DIR", Reader.PLUGIN, True)
PLUGIN_DIR = EnvVar("PDCHECK_PLUGIN_DIR", Reader.PLUGIN, True)
NIXL_PTHR_DELAY_US = EnvVar(
    "PDCHECK_NIXL_PTHR_DELAY_US",
    Reader.PLUGIN,
    True,
    "NIXL's UCX progress thread sleeps this many microseconds between polls (NIXL busy-polls)",
)
IDLE_BACKOFF_MS = EnvVar(
    "PDCHECK_IDLE_BACKOFF_MS",
    Reader.PLUGIN,
    True,
    "an idle engine's wait between empty steps doubles up to this many milliseconds (vLLM: 1)",
)
SHM_SPIN_SLEEP_US = EnvVar(
    "PDCHECK_SHM_SPIN_SLEEP_US",
    Reader.PLUGIN,
    True,
    "shared-memory queue readers sleep from this many microseconds per spin turn (vLLM: yield)",
)
ENGINE_CORE_START = EnvVar(
    "PDCHECK_ENGINE_CORE_START",
    Reader.PLUGIN,
    True,
    "the EngineCore is forked from its API server, saving an import (vLLM spawns it)",
)
KV_DIGEST = EnvVar(
    "PDCHECK_KV_DIGEST",
    Reader.PLUGIN,
    True,
    "digests of each transferred KV block, taken on the prefiller and on the decoder at first use",
)
KV_LAND_DELAY_MS = EnvVar(
    "PDCHECK_KV_LAND_DELAY_MS",
    Reader.PLUGIN,
    True,
    "a decoder's NIXL reads land in its KV blocks this many milliseconds after they are posted "
    "(a window amplifier)",
)
# Test-only: pdcheck's own mutant tests set it; a user sweep has no business with it.
MUTANT = EnvVar(
    "PDCHECK_MUTANT",
    Reader.PLUGIN,
    True,
    "a deliberately broken copy of vLLM's PD code (test-only, pdcheck's mutant tests)",
)
VLLM_FORKSERVER = EnvVar(
    "PDCHECK_VLLM_FORKSERVER",
    Reader.LAUNCHER,
    True,
    "the API server is forked from a process that imported vLLM once (pdcheck's fork server)",
    value_in_report=False,
)
CPU_FORK_SERVER = EnvVar("PDCHECK_CPU_FORK_SERVER", Reader.PDCHECK, True)
CACHE_DIR = EnvVar("PDCHECK_CACHE_DIR", Reader.PDCHECK, True)
GSM8K_DIR = EnvVar("PDCHECK_GSM8K_DIR", Reader.PDCHECK, True)

# vLLM's and UCX's own variables that serving sets on a server.
VLLM_PORT = EnvVar("VLLM_PORT", Reader.VLLM, True)
NIXL_SIDE_CHANNEL_PORT = EnvVar("VLLM_NIXL_SIDE_CHANNEL_PORT", Reader.VLLM, True)
NIXL_SIDE_CHANNEL_HOST = EnvVar("VLLM_NIXL_SIDE_CHANNEL_HOST", Reader.VLLM, True)
# Read once, by an lru_cached function whose cache is empty after the fork server's preload.
SSM_CONV_STATE_LAYOUT = EnvVar(
    "VLLM_SSM_CONV_STATE_LAYOUT",
    Reader.VLLM,
    True,
    "Mamba conv state in the DS layout NIXL needs, on both sides of the comparison",
)
ENABLE_V1_MULTIPROCESSING = EnvVar(
    "VLLM_ENABLE_V1_MULTIPROCESSING",
    Reader.VLLM,
    False,
    "the model runs inside the EngineCore (the uni executor), as on CUDA at TP 1",
)
# Read at import by some GPU modules (Triton attention, LoRA ops); pdcheck never sets it on CPU.
BATCH_INVARIANT = EnvVar(
    "VLLM_BATCH_INVARIANT",
    Reader.VLLM,
    False,
    "batch-invariant kernels: a request's tokens do not depend on its batch (bit-exact mode)",
)
UCX_NET_DEVICES = EnvVar(
    "UCX_NET_DEVICES", Reader.UCX, False, "the network devices NIXL's UCX may listen and send on"
)

# The variables that switch the plugin on: other PDCHECK_ variables (the cache and data
# folders) configure the orchestrator and may well be set in a server's environment.
PLUGIN_VARS = (
    DISABLE_FIXES,
    INJECT,
    INJECT_SEED,
    TRACE_DIR,
    NIXL_PTHR_DELAY_US,
    PLUGIN_DIR,
    IDLE_BACKOFF_MS,
    SHM_SPIN_SLEEP_US,
    ENGINE_CORE_START,
    KV_DIGEST,
    KV_LAND_DELAY_MS,
    MUTANT,
)
REGISTRY = {
    var.name: var
    for var in (
        *PLUGIN_VARS,
        VLLM_FORKSERVER,
        CPU_FORK_SERVER,
        CACHE_DIR,
        GSM8K_DIR,
        VLLM_PORT,
        NIXL_SIDE_CHANNEL_PORT,
        NIXL_SIDE_CHANNEL_HOST,
        SSM_CONV_STATE_LAYOUT,
        ENABLE_V1_MULTIPROCESSING,
        UCX_NET_DEVICES,
        BATCH_INVARIANT,
    )
}


def read_after_fork(name: str) -> bool:
    """True when no import reads `name`: servers differing in it can share a fork server."""
    var = REGISTRY.get(name)
    return var.read_after_fork if var is not None else name.startswith(PREFIX)
