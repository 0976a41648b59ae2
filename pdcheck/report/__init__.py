"""Report: markdown, JSON and JUnit renderings of a results folder."""

__all__: list[str] = []
