"""pdcheck: accuracy and race regression suite for vLLM prefill/decode disaggregated serving."""

__version__ = "0.1.0"

__all__ = ["__version__"]
