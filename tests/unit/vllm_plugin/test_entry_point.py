"""vLLM finds pdcheck's plugin by its entry point."""

from __future__ import annotations


def test_entry_point_is_declared():
    """vLLM finds the plugin through the `vllm.general_plugins` entry point named `pdcheck`."""
    from importlib.metadata import entry_points

    (ep,) = [e for e in entry_points(group="vllm.general_plugins") if e.name == "pdcheck"]
    assert ep.value == "pdcheck.vllm_plugin:register"
