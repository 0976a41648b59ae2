"""Analysis: paired statistics against a same-run baseline, agreement, verdicts, attribution."""

__all__: list[str] = []
