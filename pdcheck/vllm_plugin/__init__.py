"""pdcheck's vLLM general plugin: fix switches, fault injection, scheduler traces.

vLLM loads it in every one of its processes (entry point `vllm.general_plugins`). It does
nothing at all unless a `PDCHECK_*` variable is set. Module top is import-safe: it imports
nothing from vLLM or from pdcheck's orchestrating layers.
"""


def register() -> None:
    """vLLM's plugin hook; a no-op until the plugin issue lands."""
