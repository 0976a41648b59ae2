"""Per-question records: what every eval engine writes and what the analysis reads.

Records are appended to a JSONL file as they arrive, one line per finished question, whole
lines handed to the kernel in one write (`RecordWriter`), so an interrupted or killed run keeps
every record already written; a torn last line (power loss, full disk, a kill in the middle of a
large write) is skipped on reading.
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import msgspec

RECORD_SCHEMA_VERSION = 1


@dataclass(frozen=True)
class TokenLogprobs:
    """The generated token and the top alternatives (at least 2 when asked) at one position."""

    token: str
    logprob: float
    top: tuple[tuple[str, float], ...] = ()

    @property
    def top2_margin(self) -> float | None:
        """logprob(best) - logprob(second best): how close this position was to a tie (nats).

        None when unknown: fewer than two alternatives, or one is NaN (a value the server did
        not give, or −inf written as null), since the missing one could rank anywhere.
        """
        if len(self.top) < 2:
            return None
        best = second = -math.inf
        for _, lp in self.top:
            if math.isnan(lp):
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
        if self.logprobs is None:
            return _encode(self)
        # Each position as a compact [token, logprob, [[alternative, logprob], ...]].
        data = {name: getattr(self, name) for name in _FIELD_NAMES}
        data["logprobs"] = [[t.token, t.logprob, [list(p) for p in t.top]] for t in self.logprobs]
        return _encode(data)

    def to_json(self) -> str:
        return self.encode().decode()

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> QuestionRecord:
        known = {f.name for f in fields(cls)}
        data = {k: v for k, v in data.items() if k in known}
        if data.get("token_ids") is not None:
            data["token_ids"] = tuple(data["token_ids"])
        if data.get("logprobs") is not None:
            data["logprobs"] = tuple(
                TokenLogprobs(
                    tok,
                    _NAN if lp is None else lp,
                    tuple((a, _NAN if b is None else b) for a, b in top),
                )
                for tok, lp, top in data["logprobs"]
            )
        return cls(**data)


# Told of every record once it is written (progress, live checks).
OnRecord = Callable[[QuestionRecord], None]
# Asked of every record once it is written; True ends the run early (see `arun_eval`).
ShouldStop = Callable[[QuestionRecord], bool]

_FIELD_NAMES = tuple(f.name for f in fields(QuestionRecord))
_NAN = float("nan")  # a logprob the server did not give; JSON has no NaN, so it is written as null
# msgspec (which vLLM brings) encodes a record in about a microsecond, ~9x faster than the json
# module: on a fast server the record costs less than a tenth of its request.
_encode = msgspec.json.Encoder().encode


class RecordWriter:
    """Appends records to a JSONL file, each call's lines in one write(2) call.

    Once write() or write_many() returns, the lines are in the kernel: a killed or crashed
    process loses nothing already written, without paying an fsync per record (which costs more
    than a request on a fast server). fsync runs at most every `fsync_interval_s` and on close,
    which bounds what a power loss can take. A torn last line is skipped by `read_records`.
    """

    def __init__(
        self,
        path: str | Path,
        *,
        fsync_interval_s: float = 1.0,
        now: Callable[[], float] = time.monotonic,
    ):
        self.path = Path(path)
        self.fsync_interval_s = fsync_interval_s
        self._now = now
        self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        self._last_sync = now()
        self._dirty = False

    def write(self, record: QuestionRecord) -> None:
        self.write_many((record,))

    def write_many(self, records: Iterable[QuestionRecord]) -> None:
        """Append the records' lines in one write(2) call: a batch costs about what one line does."""
        data = b"".join([record.encode() + b"\n" for record in records])
        if not data:
            return
        while data:
            written = os.write(self._fd, data)
            data = data[written:]
        self._dirty = True
        if self._now() - self._last_sync >= self.fsync_interval_s:
            self.sync()

    def sync(self) -> None:
        if self._dirty:
            os.fsync(self._fd)
            self._dirty = False
        self._last_sync = self._now()

    def close(self) -> None:
        if self._fd < 0:
            return
        try:
            self.sync()
        finally:
            os.close(self._fd)
            self._fd = -1

    def __enter__(self) -> RecordWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def read_records(path: str | Path) -> list[QuestionRecord]:
    """Read a records file; a torn last line (from a kill mid-write) is ignored."""
    out: list[QuestionRecord] = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            if not line.endswith("\n"):
                break
            line = line.strip()
            if line:
                out.append(QuestionRecord.from_dict(json.loads(line)))
    return out
