"""Serving: vLLM server processes, ports, GPUs, the PD proxy and attach mode."""

__all__: list[str] = []
