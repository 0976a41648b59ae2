"""Evaluation: GSM8K data, prompts, answer extraction and the async client."""

__all__: list[str] = []
