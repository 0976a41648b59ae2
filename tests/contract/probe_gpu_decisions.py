"""Run inside a CUDA build (tests/contract/builds.py): print, as JSON, what that build decides on a GPU.

Every value is computed by the build's own config code on its CUDA platform (the contract
plugin answers the GPU queries for eight A100s), never written down here:
- the executor vLLM picks at TP 1 and TP 2, and the process that then hosts the worker;
- the SSM conv-state layout a hybrid model gets when nothing sets it;
- whether async scheduling is on by default;
- how `vllm serve`'s API server starts its EngineCore (the multiprocessing start method), once
  the CLI's `cli_env_setup()` and the platform's config hook have run, as in `vllm serve`.
Every server of the shipped GPU sweeps, with its NIXL connector, is built by the dry-run tests
(`pdcheck._vllm.serve_check`); this probe adds what a config does not hold (the process names).
"""

from __future__ import annotations

import inspect
import json
import re
import sys

from pdcheck._vllm.sim_scheduler import config_only_model_dir


def _config(layout: str, *, tp: int = 1):
    from vllm.config import ModelConfig, ParallelConfig, VllmConfig

    model = ModelConfig(
        model=config_only_model_dir(layout), skip_tokenizer_init=True, max_model_len=512
    )
    return VllmConfig(model_config=model, parallel_config=ParallelConfig(tensor_parallel_size=tp))


def _process_name(source: str, prefix: str) -> str:
    """The `name=` a process is started with in the build's source; without data parallelism when it varies."""
    line = next((ln for ln in source.splitlines() if re.search(r'name=f?"' + prefix, ln)), "")
    names = re.findall(r'f?"(' + prefix + r'[^"]*)"', line)
    fixed = [n for n in names if "{global_index}" not in n and "_DP" not in n]
    return (fixed or names or [f"no {prefix}* process name in the source"])[0]


def executor(tp: int) -> dict[str, str]:
    from vllm.v1.engine import utils as engine_utils
    from vllm.v1.executor.abstract import Executor
    from vllm.v1.executor.multiproc_executor import MultiprocExecutor, WorkerProc
    from vllm.v1.executor.uniproc_executor import UniProcExecutor

    config = _config("attention", tp=tp)
    cls = Executor.get_class(config)
    if issubclass(cls, UniProcExecutor):
        # The uni executor builds its worker in its own process: the engine core's.
        host = _process_name(inspect.getsource(engine_utils), "EngineCore")
    elif issubclass(cls, MultiprocExecutor):
        host = _process_name(inspect.getsource(WorkerProc.make_worker_process), "VllmWorker")
    else:
        host = f"unknown for {cls.__name__}"
    return {
        "backend": str(config.parallel_config.distributed_executor_backend),
        "executor": cls.__name__,
        "worker_cls": str(config.parallel_config.worker_cls),
        "worker_process": host,
    }


def conv_state_layout() -> str:
    from vllm.model_executor.layers.mamba.mamba_utils import get_conv_state_layout

    _config("hybrid")  # the platform's check_and_update_config runs here, as in a server
    get_conv_state_layout.cache_clear()
    return get_conv_state_layout()


def engine_core_start_method() -> str:
    """The method of `get_mp_context()`, which starts the EngineCore, as `vllm serve` has it:
    after the CLI's `cli_env_setup()`, then the platform's config hook."""
    from vllm.utils.system_utils import get_mp_context

    from pdcheck._vllm.serve_check import cli_env_setup

    cli_env_setup()
    _config("attention")  # the platform's check_and_update_config runs here, as in a server
    return get_mp_context().get_start_method()


def main() -> None:
    import vllm
    from pdcheck_contract_platform import PLACEHOLDERS, STUBBED
    from vllm.platforms import current_platform

    result = {
        "vllm_version": vllm.__version__,
        "engine_core_start_method": engine_core_start_method(),
        "platform": type(current_platform).__name__,
        "device_type": current_platform.device_type,
        "executor": {str(tp): executor(tp) for tp in (1, 2)},
        "ssm_conv_state_layout": conv_state_layout(),
        "async_scheduling_default": bool(_config("attention").scheduler_config.async_scheduling),
        "placeholder_extensions": PLACEHOLDERS,
        "stubbed": sorted(STUBBED),
    }
    print("PDCHECK-CONTRACT " + json.dumps(result))


if __name__ == "__main__":
    sys.exit(main())
