"""Question records: one line of a records file per question, as every eval engine writes it.

Written by `pdcheck.evals` (the client's runner and the lm-eval engine), read by `compare`, the
sweep's judging and the report; `pdcheck.evals.records` appends and reads the files.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import msgspec

RECORD_SCHEMA_VERSION = 1


class TokenLogprobs(msgspec.Struct, frozen=True, array_like=True):
    """The generated token and the top alternatives (at least 2 when asked) at one position.

    In a records file a position is the array `[token, logprob, [[alternative, logprob], ...]]`.
    A logprob the server did not give is None; JSON has no NaN or infinity, so those are written
    as null and read back as None too.
    """

    token: str
    logprob: float | None
    top: tuple[tuple[str, float | None], ...] = ()

    @property
    def top2_margin(self) -> float | None:
        """logprob(best) - logprob(second best): how close this position was to a tie (nats).

        None when unknown: fewer than two alternatives, or one is unknown (None or NaN), since
        the missing one could rank anywhere.
        """
        if len(self.top) < 2:
            return None
        best = second = -math.inf
        for _, lp in self.top:
            if lp is None or math.isnan(lp):
                return None
            if lp > best:
                best, second = lp, best
            elif lp > second:
                second = lp
        margin = best - second
        return None if math.isnan(margin) else margin


@dataclass(frozen=True)
class QuestionRecord:
    """One question's result on one side (baseline or PD) of one unit.

    `ok` is False when the request failed (transport, HTTP error, garbage answer); then
    `error` says why and `correct`/`invalid` are False. A failure is never scored as a
    wrong answer.
    """

    index: int
    prompt_sha256: str
    gold: str
    ok: bool
    completion: str | None = None
    token_ids: tuple[int, ...] | None = None
    logprobs: tuple[TokenLogprobs, ...] | None = None
    finish_reason: str | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    latency_s: float | None = None
    queue_s: float | None = None
    answer: str | None = None
    answers: dict[str, str | None] = field(default_factory=dict)
    correct: bool = False
    invalid: bool = False
    error: str | None = None
    http_status: int | None = None
    attempts: int = 1
    request_id: str | None = None

    def encode(self) -> bytes:
        """One JSON line without its line end: the fields in order, tuples as arrays, NaN as null."""
        return _encode(self)

    def to_json(self) -> str:
        return self.encode().decode()


# msgspec (which vLLM brings) encodes a record in about a microsecond, ~9x faster than the json
# module: on a fast server the record costs less than a tenth of its request.
_encode = msgspec.json.Encoder().encode
