"""The bit-exact section: which levels were judged exactly, why the others were not, and every
greedy divergence from the baseline with the baseline's top-2 margin where it happened.

From the store only (`VerdictFile.exact`, written by judging for cells with `serving.bit_exact`).
A level judged exactly must show every greedy output identical, or it is a REGRESSION; a level
that fell back to the paired test lists its divergences so near-ties read as near-ties.
"""

from __future__ import annotations

from pdcheck.analysis.exact import ExactDivergence
from pdcheck.report.sections import table
from pdcheck.results.load import RunResults

__all__ = ["exactness_section"]

# Divergences listed by name per level; the counts are always exact.
_FIRST = 5


def exactness_section(run: RunResults) -> str | None:
    """The section's markdown, or None when no cell of the run was in bit-exact mode."""
    rows: list[list[str]] = []
    reasons: dict[str, str] = {}
    listed: list[str] = []
    for cell in run.cells:
        for concurrency, entry in sorted(cell.verdicts.items()):
            check = entry.exact
            if check is None:
                continue
            reasons.setdefault(cell.name, check.reason)
            rows.append(
                [
                    cell.name,
                    str(concurrency),
                    "exactly" if check.exact else "paired test",
                    f"{check.n_identical}/{check.n_pairs}",
                    _first(check.divergences),
                ]
            )
            listed += [
                f"- {cell.name} c{concurrency}: {d.describe()}" for d in check.divergences[:_FIRST]
            ]
    if not rows:
        return None
    exact = sorted({r[0] for r in rows if r[2] == "exactly"})
    parts = [
        "In bit-exact mode a cell whose kernels are exact (decided from its platform, model kind, "
        "dtype and attention backend before it runs) must reproduce the baseline's greedy tokens: "
        "a divergence on a clean level is a REGRESSION, with no margin. Other cells fall back to "
        "the paired test.",
        f"Judged exactly: {', '.join(exact) if exact else 'none'}.",
        table(["cell", "c", "judged", "identical", "first divergence"], rows),
        "Why:\n\n" + "\n".join(f"- {name}: {why}" for name, why in reasons.items()),
    ]
    if listed:
        # The margin, not SUSPECT's tie/corruption grade: that grade uses the policy's floor,
        # while a bfloat16 near-tie can sit one bf16 step (0.0625 nats at logits of 8-16) apart.
        parts.append(
            "Divergences (the baseline's top-2 margin where PD parted):\n\n" + "\n".join(listed)
        )
    return "\n\n".join(parts)


def _first(divergences: tuple[ExactDivergence, ...]) -> str:
    return f"q{divergences[0].index:05d} at token {divergences[0].position}" if divergences else "–"
