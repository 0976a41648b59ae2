"""The KV-integrity section: per PD cell and concurrency, the blocks whose digests were compared.

From the store only (`KvEvidence.kv_digest`, one join per unit, written by the sweep). A clean
arm must show 0 mismatches over a non-zero number of blocks; an injected arm's mismatched
questions are scored against its injection log (precision and recall, as for divergences).
A prefiller that advertised its blocks out of the request's block-table order is listed with
the positions and the token ranges the blocks sent there hold. Digests come only from servers
that load pdcheck's plugin with `serving.kv_digest`, so attached servers have none, and the
section says so rather than showing zeros.
"""

from __future__ import annotations

from collections.abc import Sequence

from pdcheck.analysis.injection import injection_precision
from pdcheck.analysis.kv_digest import DigestMismatch, ExtentMismatch, KvDigestSummary
from pdcheck.contracts.plugin_files import InjectionRecord
from pdcheck.report.sections import table
from pdcheck.results.load import CellResult, RunResults

__all__ = ["kv_integrity_section"]

# Mismatches listed by name; the counts are always exact.
_FIRST = 5


def kv_integrity_section(run: RunResults) -> str | None:
    """The section's markdown, or None when no unit of the run recorded digests."""
    rows: list[list[str]] = []
    first: list[tuple[str, int, DigestMismatch]] = []
    refusals: list[str] = []
    for cell in run.cells:
        for concurrency in sorted({c for c, _ in cell.kv}):
            row = _row(cell, concurrency, first, refusals)
            if row is not None:
                rows.append(row)
    if not rows:
        return None
    parts = [
        "KV digests compare each block a decoder loaded, right before its first forward, with "
        "the block its prefiller wrote. A mismatch on a clean arm is corruption, whatever the "
        "accuracy says; on an injected arm the mismatched questions must be the injected ones.",
        table(
            ["cell", "c", "requests", "blocks checked", "mismatches", "questions", "vs injected"],
            rows,
        ),
    ]
    parts += _listing(
        "First mismatches",
        [
            f"- {cell} c{c}: {_where(m)}, group {m.group}, block {m.position}, TP rank {m.tp_rank}"
            for cell, c, m in first[:_FIRST]
        ],
    )
    extents = [
        f"- {cell} c{c}: {s.n_extent_mismatches} loads; first "
        f"{_where(e)}: prefiller computed {e.prefiller_tokens} tokens, decoder took "
        f"{e.decoder_tokens}"
        for cell, c, s in _digests(run)
        for e in s.extent_mismatches[:1]
    ]
    parts += _listing(
        "Loads whose prompt-token count differs between prefiller and decoder (the decoder "
        "reads the blocks as another prefix than the one written)",
        extents,
    )
    orders = [
        f"- {cell} c{c}: {s.n_order_mismatches} loads; first: {o.describe()}"
        for cell, c, s in _digests(run)
        for o in s.order_mismatches[:1]
    ]
    parts += _listing(
        "Loads whose prefiller advertised its blocks out of the request's block-table order "
        "(the decoder loads those blocks as other parts of the prompt)",
        orders,
    )
    unchecked = [
        f"{cell} c{c} ({s.order_unchecked} loads)"
        for cell, c, s in _digests(run)
        if s.order_unchecked
    ]
    if unchecked:
        parts.append(
            "Block order not checked for "
            + ", ".join(unchecked)
            + ": their prefiller records carry no block table (a vLLM the digest hook cannot "
            "read it from; the digests are then of the advertised blocks)."
        )
    parts += [f"Not compared: {r}" for r in refusals]
    if any(cell.kv and not _has_digests(cell) for cell in run.cells):
        parts.append(
            "Cells without a row ran without digests (`serving.kv_digest` off, or servers not "
            "started by pdcheck: only servers that load pdcheck's plugin write them)."
        )
    return "\n\n".join(parts)


def _listing(heading: str, lines: list[str]) -> list[str]:
    """A paragraph of `heading` and its bullet lines, or none when there are no lines."""
    return [f"{heading}:\n\n" + "\n".join(lines)] if lines else []


def _row(
    cell: CellResult,
    concurrency: int,
    first: list[tuple[str, int, DigestMismatch]],
    refusals: list[str],
) -> list[str] | None:
    evidence = [kv for (c, _), kv in sorted(cell.kv.items()) if c == concurrency]
    summaries = [kv.kv_digest for kv in evidence if kv.kv_digest is not None]
    if not summaries:
        return None
    refusals += [f"{cell.name} c{concurrency}: {s.refused}" for s in summaries if s.refused]
    first += [(cell.name, concurrency, m) for s in summaries for m in s.mismatches]
    questions = sorted({q for s in summaries for q in s.mismatched_questions})
    injections = [i for kv in evidence for i in kv.injections or ()]
    inject = cell.spec.arm.inject if cell.spec else None
    return [
        cell.name,
        str(concurrency),
        str(sum(s.requests_checked for s in summaries)),
        str(sum(s.blocks_checked for s in summaries)),
        str(sum(s.n_mismatches for s in summaries)),
        _questions(questions),
        _score(injections, questions) if inject else "–",
    ]


def _digests(run: RunResults) -> list[tuple[str, int, KvDigestSummary]]:
    """Every unit's digest join in the run: its cell's name, concurrency and join."""
    return [
        (cell.name, c, kv.kv_digest)
        for cell in run.cells
        for (c, _r), kv in sorted(cell.kv.items())
        if kv.kv_digest is not None
    ]


def _has_digests(cell: CellResult) -> bool:
    return any(kv.kv_digest is not None for kv in cell.kv.values())


def _score(injections: Sequence[InjectionRecord], questions: Sequence[int]) -> str:
    score = injection_precision(injections, questions)
    p, r = score.precision, score.recall
    return (
        f"precision {'–' if p is None else f'{p:.2f}'}, recall {'–' if r is None else f'{r:.2f}'}"
    )


def _questions(questions: Sequence[int]) -> str:
    shown = ", ".join(f"q{q:05d}" for q in questions[:_FIRST])
    more = len(questions) - _FIRST
    return (shown + (f" (+{more})" if more > 0 else "")) or "–"


def _where(m: DigestMismatch | ExtentMismatch) -> str:
    return f"q{m.question:05d}" if m.question is not None else m.x_request_id
