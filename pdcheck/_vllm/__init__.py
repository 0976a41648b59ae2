"""The adapter: the only place that names vLLM internals. Imported only by race and vllm_plugin."""
