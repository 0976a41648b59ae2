"""The prefix-caching section: per PD level whose decoders hit their own prefix cache, how much.

From the store only (`KvEvidence.decoders`, vLLM's `prompt_tokens_by_source` counters scraped
around each PD unit). On a PD decoder a prompt token from its own prefix cache sits beside
tokens it read from the prefiller: a partial prefix hit, the case where the read must start
after the hit (issue 29: trimming the wrong end of the block list corrupts only then). A
prefix-caching arm with no hit proved nothing about that path, and the section shows it.
"""

from __future__ import annotations

from pdcheck.report.sections import table
from pdcheck.results.load import RunResults

__all__ = ["prefix_cache_section"]


def prefix_cache_section(run: RunResults) -> str | None:
    """The section's markdown, or None when no cell runs its PD servers with prefix caching."""
    rows: list[list[str]] = []
    for cell in run.cells:
        if cell.spec is None or not cell.spec.arm.prefix_caching:
            continue
        for concurrency in sorted({c for c, _ in cell.kv}):
            deltas = [
                d for (c, _), kv in sorted(cell.kv.items()) if c == concurrency for d in kv.decoders
            ]
            local = sum(d.local_cache_hit_tokens for d in deltas)
            remote = sum(d.external_kv_tokens for d in deltas)
            rows.append(
                [
                    cell.name,
                    str(concurrency),
                    f"{local:.0f}",
                    f"{remote:.0f}",
                    "yes" if local > 0 and remote > 0 else "**none**",
                ]
            )
    if not rows:
        return None
    return "\n\n".join(
        [
            "Prompt tokens the decoders took from their own prefix cache beside the tokens they "
            "read from the prefiller: each local hit makes a read partial (it starts after the "
            "hit). A prefix-caching arm without any proved nothing about that path.",
            table(["cell", "c", "local prefix-cache tokens", "tokens read", "partial hits"], rows),
        ]
    )
