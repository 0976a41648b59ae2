"""Turn the plugin's environment into patches in this vLLM process, then leave a marker.

Runs inside `register()`, in every vLLM process (API server, engine core, workers, the model
inspection subprocess). Order matters: the NIXL delay hook goes first, because checking the
worker internals imports vLLM's NIXL connector, which imports NIXL. Every error propagates:
vLLM lets an exception from `register()` kill start-up, which is what an arm that asked for a
switch and would silently run without it needs.
"""

from __future__ import annotations

import importlib.metadata
import logging
from collections.abc import Callable, Mapping

from pdcheck.vllm_plugin.settings import ENGINE_CORE_START_VAR, PluginSettings, parse_settings

__all__ = ["activate"]

logger = logging.getLogger(__name__)


def activate(environ: Mapping[str, str]) -> list[str]:
    """Apply every switch `environ` asks for; return them as the marker lists them."""
    from pdcheck._vllm import internals, patches

    settings = parse_settings(environ)
    applied: list[str] = []
    if settings.nixl_pthr_delay_us is not None:
        from pdcheck.vllm_plugin.nixl_delay import install_nixl_delay

        install_nixl_delay(
            settings.nixl_pthr_delay_us,
            describe_version=lambda: _versions(internals.vllm_version()),
        )
        applied.append(f"nixl-pthr-delay-us={settings.nixl_pthr_delay_us}")
    if settings.idle_backoff_ms is not None or settings.shm_spin_sleep_us is not None:
        applied += _install_idle_waits(settings)
    if settings.engine_core_start is not None:
        from pdcheck._vllm import engine_start

        engine_start.check_engine_start_names()
        engine_start.fork_engine_core(ENGINE_CORE_START_VAR)
        applied.append(f"engine-core-start={settings.engine_core_start}")
    if settings.disable_fixes is not None:
        from pdcheck.vllm_plugin import switches

        applied += [f"disable-fix={name}" for name in switches.install_from_env(environ)]
    if settings.trace_dir is not None:
        from pdcheck.vllm_plugin import trace_recorder

        if trace_recorder.install_from_env(environ):
            applied.append(f"trace={settings.trace_dir}")
    if settings.inject is not None or settings.kv_digest:
        _install_kv_hooks(settings)
    if settings.inject is not None:
        applied.append(settings.inject.describe())
    if settings.kv_digest:
        applied.append("kv-digest")
    if settings.kv_land_delay_ms is not None:
        from pdcheck._vllm.land_delay import install_land_delay

        install_land_delay(settings.kv_land_delay_ms)
        applied.append(f"kv-land-delay-ms={settings.kv_land_delay_ms}")
    if settings.mutant is not None:
        from pdcheck._vllm.serving_mutants import install_mutant

        # Last, outside the KV hooks: the digest hook must see what vLLM's own code decided
        # (early-free: that the blocks were to be held), not what the mutant makes of it.
        install_mutant(settings.mutant)
        applied.append(f"mutant={settings.mutant}")
    from pdcheck._vllm.clean_stop import install_clean_stop

    # In every server the plugin is active in: a traceback in its log is then evidence.
    if install_clean_stop():
        applied.append("clean-stop")
    if settings.plugin_dir is not None:
        from pdcheck.vllm_plugin.marker import (
            SCHEDULER_BUILT,
            record_in_marker,
            write_activation_marker,
        )

        path = write_activation_marker(
            settings.plugin_dir,
            vllm_version=internals.vllm_version(),
            switches=applied,
            fixes_present=internals.fixes_present(),
        )
        plugin_dir = settings.plugin_dir
        # After the fix switches, so a scheduler this reports on was built with them.
        patches.on_scheduler_built(
            lambda async_scheduling: record_in_marker(
                plugin_dir, SCHEDULER_BUILT, async_scheduling=async_scheduling
            )
        )
        logger.info(
            "pdcheck plugin active (%s); marker %s", ", ".join(applied) or "marker only", path
        )
    return applied


def _install_kv_hooks(settings: PluginSettings) -> None:
    """The hooks on a worker's KV: fault injection into finished loads, and KV digests."""
    from pdcheck._vllm.worker import LoadedRequest, check_worker_names, install_receive_hook
    from pdcheck.vllm_plugin.marker import (
        KV_LOAD_HOOK_WITH_KV_CACHES,
        InjectionLog,
        record_in_marker,
    )

    assert settings.plugin_dir is not None  # parse_settings guarantees it with either switch
    plugin_dir = settings.plugin_dir
    check_worker_names()
    on_loaded: list[Callable[[list[LoadedRequest]], None]] = []
    if settings.inject is not None:
        from pdcheck.vllm_plugin.inject import Injector

        on_loaded.append(Injector(settings.inject, InjectionLog(plugin_dir)).on_loaded)
    if settings.kv_digest:
        from pdcheck._vllm.kv_digest_hooks import check_digest_names, install_sent_blocks_hooks
        from pdcheck.vllm_plugin.kv_digest import KvDigester

        check_digest_names()
        digester = KvDigester(plugin_dir)
        # After the injector: a load is digested when the next step starts, whatever the order,
        # but keeping it last says what the digest sees.
        on_loaded.append(digester.on_loaded)
        install_sent_blocks_hooks(digester.on_step_start)

    def loaded(requests: list[LoadedRequest]) -> None:
        for callback in on_loaded:
            callback(requests)

    install_receive_hook(
        loaded,
        on_kv_caches_registered=lambda tp_rank: record_in_marker(
            plugin_dir, KV_LOAD_HOOK_WITH_KV_CACHES, tp_rank=tp_rank
        ),
    )


def _install_idle_waits(settings: PluginSettings) -> list[str]:
    from pdcheck._vllm import idle

    idle.check_idle_names()
    applied = []
    if settings.idle_backoff_ms is not None:
        idle.back_off_idle_steps(settings.idle_backoff_ms / 1000)
        applied.append(f"idle-backoff-ms={settings.idle_backoff_ms}")
    if settings.shm_spin_sleep_us is not None:
        idle.sleep_in_shm_spins(settings.shm_spin_sleep_us / 1e6)
        applied.append(f"shm-spin-sleep-us={settings.shm_spin_sleep_us}")
    return applied


def _versions(vllm_version: str) -> str:
    """`0.32.0 with nixl 1.5.1`: the version string VllmIncompatible names when NIXL's internals differ."""
    try:
        nixl = importlib.metadata.version("nixl")
    except importlib.metadata.PackageNotFoundError:
        nixl = "unknown"
    return f"{vllm_version} with nixl {nixl}"
