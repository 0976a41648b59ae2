"""The block-boundary coverage section: per cell, which boundary token counts its prompts hit.

From the store only: the cell's plan (`eval.edge_plan` in cell.json) says which targets and
block size, and the token counts are the ones the server reported for each prompt
(`QuestionRecord.prompt_tokens`), so the section shows what was served, not what was planned.
A cell that asked no prompt on a boundary cannot have caught a bug that acts only there.
"""

from __future__ import annotations

from pdcheck.evals.edges import served_coverage
from pdcheck.results.load import CellResult, RunResults

__all__ = ["boundary_section"]


def boundary_section(run: RunResults) -> str | None:
    """The section's markdown, or None when no cell asks for block-boundary prompts."""
    lines: list[str] = []
    for cell in run.cells:
        spec = cell.spec
        if spec is None or not spec.eval.edges:
            continue
        plan = spec.eval.edge_plan
        if plan is None:
            lines.append(
                f"- `{cell.name}`: block-boundary coverage: none (the model's tokenizer was not "
                "on the machine at plan time)"
            )
            continue
        tokens = _served_tokens(cell)
        text = (
            served_coverage(plan, tokens).describe()
            if tokens
            else "block-boundary coverage: no prompt token counts recorded"
        )
        lines.append(f"- `{cell.name}`: {text}")
    if not lines:
        return None
    return "\n\n".join(
        [
            "Prompts whose token counts land at k·B-1, k·B and k·B+1 for the servers' block "
            "size B (`eval.edges`), counted by the server: a read one block short or long acts "
            "only there (docs/sweep-files.md, block-boundary prompts).",
            "\n".join(lines),
        ]
    )


def _served_tokens(cell: CellResult) -> list[int]:
    """The prompt token counts of the first unit that recorded them, baseline first."""
    for side in ("baseline", "pd"):
        for unit in sorted((u for u in cell.units if u.side == side), key=lambda u: -u.concurrency):
            counts = [r.prompt_tokens for r in unit.records() if r.prompt_tokens is not None]
            if counts:
                return counts
    return []
