"""Race harness: vLLM's real scheduler in-process with a simulated executor and a shadow-memory checker."""

__all__: list[str] = []
