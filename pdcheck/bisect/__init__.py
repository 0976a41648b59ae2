"""Bisect: find the vLLM commit that brought a PD race or accuracy regression back."""

__all__: list[str] = []
