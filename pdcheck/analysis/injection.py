"""Injection precision: do the questions the analysis flags match the ones the plugin corrupted?

The vLLM plugin logs one line per injected request in `injections.jsonl`, keyed by the
X-Request-Id the eval client sent (`<run_tag>-q<index:05d>`). The question index is recovered
with `-q(\\d+)$`. Against the questions the analysis flags (usually those whose greedy output
diverged from the baseline), precision says how many flags were real injections and recall how
many injections were seen. A clean pipeline has recall near 1 for heavy faults; precision below
1 means divergences that the injection does not explain (numeric jitter, or another race).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

from pdcheck.analysis.agreement import CORRUPTION, Agreement
from pdcheck.contracts.plugin_files import InjectionRecord

__all__ = [
    "InjectionPrecision",
    "divergence_precision",
    "flagged_questions",
    "injected_indices",
    "injection_precision",
]

_QUESTION_SUFFIX = re.compile(r"-q(\d+)$")
# How many example indices to keep per list; the counts are always exact.
_EXAMPLES = 20


def injected_indices(
    injections: Iterable[InjectionRecord | str], *, run_tag: str | None = None
) -> set[int]:
    """Question indices named by injection records (or their `x_request_id`s).

    With `run_tag`, only ids of that run (`<run_tag>-q…`) count: one log may cover several runs.
    """
    out: set[int] = set()
    for entry in injections:
        rid = entry if isinstance(entry, str) else entry.x_request_id
        if not rid:
            raise ValueError(f"injection log entry has no x_request_id: {entry!r}")
        if run_tag is not None and not rid.startswith(f"{run_tag}-q"):
            continue
        m = _QUESTION_SUFFIX.search(rid)
        if m is None:
            raise ValueError(
                f"x_request_id {rid!r} does not end in -q<index>; ids must be '<run_tag>-q<index:05d>'"
            )
        out.add(int(m.group(1)))
    return out


@dataclass(frozen=True)
class InjectionPrecision:
    """Flagged questions against injected ones."""

    n_injected: int
    n_flagged: int
    n_true_positive: int
    precision: float | None
    recall: float | None
    false_positives: tuple[int, ...]  # flagged, not injected (first few)
    missed: tuple[int, ...]  # injected, not flagged (first few)


def injection_precision(
    injections: Iterable[InjectionRecord | str],
    flagged: Iterable[int],
    *,
    run_tag: str | None = None,
    questions: Iterable[int] | None = None,
) -> InjectionPrecision:
    """Precision and recall of `flagged` question indices against the injection log.

    `questions` limits both sides to the indices this run actually compared (an injected request
    whose record failed cannot be flagged).
    """
    injected = injected_indices(injections, run_tag=run_tag)
    flagged_set = set(flagged)
    if questions is not None:
        scope = set(questions)
        injected &= scope
        flagged_set &= scope
    hits = injected & flagged_set
    return InjectionPrecision(
        n_injected=len(injected),
        n_flagged=len(flagged_set),
        n_true_positive=len(hits),
        precision=len(hits) / len(flagged_set) if flagged_set else None,
        recall=len(hits) / len(injected) if injected else None,
        false_positives=tuple(sorted(flagged_set - injected)[:_EXAMPLES]),
        missed=tuple(sorted(injected - flagged_set)[:_EXAMPLES]),
    )


def flagged_questions(agreement: Agreement) -> list[int]:
    """The questions the agreement check flags: corruption-grade divergences.

    A near-tie flip is numeric jitter, not damage, so it is not a flag. Without logprobs no
    divergence can be graded, and every divergence counts.
    """
    divergences = agreement.divergences
    graded = any(d.margin_nats is not None for d in divergences)
    return [d.index for d in divergences if not graded or d.grade == CORRUPTION]


def divergence_precision(
    injections: Iterable[InjectionRecord | str],
    agreement: Agreement,
    *,
    run_tag: str | None = None,
    questions: Iterable[int] | None = None,
) -> InjectionPrecision:
    """Precision and recall of the agreement check's flags (`flagged_questions`) against the log."""
    return injection_precision(
        injections, flagged_questions(agreement), run_tag=run_tag, questions=questions
    )
