"""Record builders for the analysis tests: paired baseline/PD records from outcome arrays."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeVar

import msgspec

from pdcheck.contracts.plugin_files import InjectionRecord
from pdcheck.evals.records import QuestionRecord, TokenLogprobs
from pdcheck.results.schema import from_json, to_json

T = TypeVar("T")


def json_round_trip(value: T) -> T:
    """`value` written and read back as the results store does."""
    return from_json(to_json(value), type(value))


def injection(x_request_id: str, *, kind: str = "zero-loaded-kv") -> InjectionRecord:
    """One injected request, as the plugin logs it."""
    return InjectionRecord(
        x_request_id=x_request_id,
        request_id="cmpl-1-0-aaaaaaaa",
        kind=kind,
        fraction=1.0,
        seed=0,
        blocks=[[1]],
        pid=1,
        tp_rank=0,
        t=0.0,
    )


def injection_line(x_request_id: str) -> bytes:
    """`injection(x_request_id)` as a line of the plugin's injections.jsonl."""
    return msgspec.json.encode(injection(x_request_id)) + b"\n"


def record(
    index: int,
    *,
    correct: bool,
    ok: bool = True,
    invalid: bool = False,
    token_ids: Sequence[int] | None = (1, 2, 3),
    margins: Sequence[float] | None = None,
    completion: str | None = None,
    request_id: str | None = None,
) -> QuestionRecord:
    """One record; `margins` gives the top-2 logprob margin (nats) at each generated position."""
    logprobs = None
    if margins is not None:
        logprobs = tuple(
            TokenLogprobs(f"t{i}", -0.01, (("a", -0.01), ("b", -0.01 - m)))
            for i, m in enumerate(margins)
        )
    return QuestionRecord(
        index=index,
        prompt_sha256=f"sha{index}",
        gold="1",
        ok=ok,
        completion=completion if completion is not None else " ".join(map(str, token_ids or ())),
        token_ids=tuple(token_ids) if token_ids is not None else None,
        logprobs=logprobs,
        correct=correct and ok,
        invalid=invalid and ok,
        error=None if ok else "HTTP 500",
        request_id=request_id,
    )


def side(outcomes: Sequence[bool], *, start: int = 0) -> list[QuestionRecord]:
    return [record(start + i, correct=bool(c)) for i, c in enumerate(outcomes)]


def paired_sides(
    *, both: int, worse: int, better: int, neither: int
) -> tuple[list[QuestionRecord], list[QuestionRecord]]:
    """Baseline and PD sides with exactly these counts of (both right, PD-worse, PD-better, both wrong)."""
    base = [True] * both + [True] * worse + [False] * better + [False] * neither
    pd = [True] * both + [False] * worse + [True] * better + [False] * neither
    return side(base), side(pd)
