"""pdcheck's vLLM general plugin: fix switches, fault injection, scheduler traces, NIXL delay.

vLLM loads it in every one of its processes (entry point `vllm.general_plugins`, name
`pdcheck`). It does nothing at all unless one of its variables is set (see
`settings.PLUGIN_VARS` and docs/vllm-plugin.md). Import-safe: vLLM logs and *skips* a plugin
whose import fails, so this module imports nothing at its top, and all work (including the
check of vLLM's internals, which raises) happens inside `register()`.
"""

__all__ = ["register"]

_registered = False


def register() -> None:
    """vLLM's plugin hook: apply the switches the environment asks for, once per process."""
    global _registered
    import os

    from pdcheck.vllm_plugin.settings import PLUGIN_VARS

    if _registered or not any(os.environ.get(name, "").strip() for name in PLUGIN_VARS):
        return
    from pdcheck.vllm_plugin.activate import activate

    activate(os.environ)  # every patch is idempotent, so a failed attempt may be retried
    _registered = True
