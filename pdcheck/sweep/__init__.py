"""Sweep: orchestration of cells and units, and the results store."""

__all__: list[str] = []
