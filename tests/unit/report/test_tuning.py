"""The report's environment section names what pdcheck changed in how vLLM ran."""

from __future__ import annotations

from types import SimpleNamespace

from pdcheck.report.sections import tuning_lines


def _server(role: str, **env: str) -> SimpleNamespace:
    return SimpleNamespace(role=role, env=env)


def test_every_variable_that_changes_vllm_is_named_with_its_values_and_roles():
    """A variable with a stated effect on vLLM is listed once, with each value and the roles
    that had it; bookkeeping (ports, marker folders) is not, and a socket path is not shown."""
    lines = tuning_lines(
        [
            _server(
                "baseline",
                PDCHECK_IDLE_BACKOFF_MS="16",
                VLLM_PORT="30000",
                PDCHECK_VLLM_FORKSERVER="/tmp/x/fork.sock",
            ),
            _server(
                "decode",
                PDCHECK_IDLE_BACKOFF_MS="16",
                PDCHECK_NIXL_PTHR_DELAY_US="1000",
                PDCHECK_PLUGIN_DIR="/run/plugin/decode-0",
                UCX_NET_DEVICES="lo",
            ),
        ]
    )
    text = "\n".join(lines)
    assert "`PDCHECK_IDLE_BACKOFF_MS=16` (baseline, decode):" in text
    assert "`PDCHECK_NIXL_PTHR_DELAY_US=1000` (decode):" in text
    assert "`UCX_NET_DEVICES=lo` (decode):" in text
    assert "`PDCHECK_VLLM_FORKSERVER` (baseline):" in text and "fork.sock" not in text
    assert "VLLM_PORT" not in text and "PLUGIN_DIR" not in text
    assert len(lines) == 4
