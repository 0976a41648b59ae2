"""`python -m pdcheck._vllm.serve_check`: check `vllm serve` arguments with vLLM's own code.

Serving runs this in the python that will run the servers (never importing vLLM itself), sends
a `ServeCheckRequest` on standard input and reads one `ServeCheck` per server back
(`pdcheck.contracts.vllm_programs`). Each server's arguments go through vLLM's serve parser and
`validate_parsed_serve_args`. With `build_config`, each server is then set up as `vllm serve`
sets it up, in a fork of this process (so no server's environment or vLLM's caches leak into
the next): its whole environment, `cli_env_setup()`, then `create_engine_config()`. That is
where conflicts that parsing cannot see show (an explicit `--async-scheduling` vLLM cannot
honour, a hybrid KV cache the configuration cannot support, a max-model-len the model does not
allow), and where vLLM decides the model runner, executor, async default, EngineCore start
method and Mamba conv-state layout, all reported as vLLM computed them.

A config is built only on the platform the servers will run on (`device_type`): anything else
would answer for another machine. A model whose config cannot be fetched (no network, no cache)
is "not built", not a problem of the server.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import io
import json
import os
import sys
import traceback
from collections.abc import Callable
from dataclasses import asdict
from types import ModuleType
from typing import Any

from pdcheck.contracts.vllm_programs import (
    EngineDecisions,
    ServeCheck,
    ServeCheckRequest,
    ServerToCheck,
    render_result,
)

# Where `make_arg_parser` and `validate_parsed_serve_args` live, newest vLLM first: 0.33 moved
# them to entrypoints.common; 0.32 has them in entrypoints.launchers; older releases in
# entrypoints.openai.
SERVE_PARSER_MODULES = (
    "vllm.entrypoints.common.cli_args",
    "vllm.entrypoints.launchers.cli_args",
    "vllm.entrypoints.openai.cli_args",
)
# Where `cli_env_setup` (what `vllm`'s CLI runs before any subcommand) lives, newest first.
CLI_ENV_SETUP_MODULES = (
    "vllm.entrypoints.common.startup",
    "vllm.entrypoints.serve.utils.api_utils",
    "vllm.entrypoints.utils",
)


def _first_having(homes: tuple[str, ...], attribute: str) -> ModuleType:
    """The first module among `homes` that exists and has `attribute`; a broken import inside
    one that exists still raises."""
    for home in homes:
        try:
            module = importlib.import_module(home)
        except ModuleNotFoundError as exc:
            if not home.startswith(exc.name or "?"):
                raise
            continue
        if hasattr(module, attribute):
            return module
    sys.exit(f"no vLLM module among {', '.join(homes)} has {attribute}")


def cli_env_setup() -> None:
    """What `vllm`'s CLI runs before any subcommand (it sets the start method to spawn)."""
    _first_having(CLI_ENV_SETUP_MODULES, "cli_env_setup").cli_env_setup()


def _parser_factory() -> tuple[Callable[[], Any], Callable[[Any], None]]:
    try:
        from vllm.utils.argparse_utils import FlexibleArgumentParser
    except ImportError:
        from vllm.utils import FlexibleArgumentParser
    cli_args = _first_having(SERVE_PARSER_MODULES, "make_arg_parser")

    def new_parser() -> Any:
        return cli_args.make_arg_parser(FlexibleArgumentParser(prog="vllm serve"))

    return new_parser, cli_args.validate_parsed_serve_args


def parse(args: list[str], new_parser: Callable[[], Any], validate: Callable[[Any], None]):
    """(the parsed namespace or None, problems) for one server's arguments."""
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            namespace = new_parser().parse_args(args)
    except SystemExit:
        lines = err.getvalue().strip().splitlines()
        return None, [lines[-1] if lines else "vLLM's parser rejected the arguments"]
    try:
        validate(namespace)
    except Exception as exc:
        return None, [f"{type(exc).__name__}: {exc}"]
    return namespace, []


def decisions_of(vllm_config: Any) -> EngineDecisions:
    """What vLLM decided in building this config, read from vLLM's own objects and functions."""
    from vllm.platforms import current_platform
    from vllm.utils.system_utils import get_mp_context
    from vllm.v1.executor.abstract import Executor

    layout = None
    if vllm_config.model_config.is_hybrid:
        from vllm.model_executor.layers.mamba.mamba_utils import get_conv_state_layout

        get_conv_state_layout.cache_clear()
        layout = str(get_conv_state_layout())
    transfer = vllm_config.kv_transfer_config
    return EngineDecisions(
        device_type=str(current_platform.device_type),
        model_runner="v2" if vllm_config.use_v2_model_runner else "v1",
        executor_backend=str(vllm_config.parallel_config.distributed_executor_backend),
        executor=Executor.get_class(vllm_config).__name__,
        async_scheduling=bool(vllm_config.scheduler_config.async_scheduling),
        start_method=get_mp_context().get_start_method(),
        conv_state_layout=layout,
        kv_connector=transfer.kv_connector if transfer else None,
        kv_role=transfer.kv_role if transfer else None,
        max_model_len=int(vllm_config.model_config.max_model_len),
        hybrid_kv_cache_manager=not vllm_config.scheduler_config.disable_hybrid_kv_cache_manager,
    )


def build(server: ServerToCheck, new_parser, validate) -> ServeCheck:
    """One server set up as `vllm serve` sets it up: its environment, `cli_env_setup`, its
    arguments, then the engine config. Run in a fork: it changes this process for good."""
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.usage.usage_lib import UsageContext

    if server.env is not None:
        os.environ.clear()
        os.environ.update(server.env)
    cli_env_setup()
    namespace, problems = parse(server.args, new_parser, validate)
    if namespace is None:
        return ServeCheck(problems)
    # What `vllm serve`'s subcommand does first (ServeSubcommand.cmd): the positional model wins.
    if getattr(namespace, "model_tag", None) is not None:
        namespace.model = namespace.model_tag
    try:
        config = AsyncEngineArgs.from_cli_args(namespace).create_engine_config(
            usage_context=UsageContext.OPENAI_API_SERVER
        )
    except OSError as exc:  # the model's files: no network, no cache, no such repository
        return ServeCheck([], None, f"the model's config could not be read: {exc}")
    except Exception as exc:
        return ServeCheck([f"create_engine_config: {type(exc).__name__}: {exc}"])
    return ServeCheck([], decisions_of(config))


def _in_fork(work: Callable[[], ServeCheck]) -> ServeCheck:
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read_fd)
        try:
            check = work()
        except BaseException:
            check = ServeCheck([f"the check itself failed: {traceback.format_exc(limit=-3)}"])
        with os.fdopen(write_fd, "w") as out:
            out.write(json.dumps(asdict(check)))
        os._exit(0)
    os.close(write_fd)
    with os.fdopen(read_fd) as answer:
        text = answer.read()
    _, status = os.waitpid(pid, 0)
    if not text:
        return ServeCheck([f"the check died (wait status {status})"])
    return ServeCheck.from_dict(json.loads(text))


def check(request: ServeCheckRequest) -> list[ServeCheck]:
    new_parser, validate = _parser_factory()
    not_built = None
    if request.build_config:
        from vllm.platforms import current_platform

        here = str(current_platform.device_type)
        if request.device_type is not None and here != request.device_type:
            not_built = f"this vLLM runs the {here or 'unknown'} platform, the servers {request.device_type}"
    if not request.build_config or not_built:
        return [
            ServeCheck(parse(s.args, new_parser, validate)[1], None, not_built)
            for s in request.servers
        ]
    return [_in_fork(functools.partial(build, s, new_parser, validate)) for s in request.servers]


def main() -> None:
    request = ServeCheckRequest.from_json(sys.stdin.read())
    print(render_result(check(request)), flush=True)


if __name__ == "__main__":
    main()
