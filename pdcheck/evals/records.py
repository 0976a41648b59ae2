"""Per-question records: what every eval engine writes and what the analysis reads.

Records are appended to a JSONL file as they arrive, one line per finished question, whole
lines handed to the kernel in one write (`RecordWriter`), so an interrupted or killed run keeps
every record already written; a torn last line (power loss, full disk, a kill in the middle of a
large write) is skipped on reading. Reading decodes each line into its type: a line that is not
a record is refused with the file and the line (`read_records`).
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Callable, Container, Iterable
from pathlib import Path

from pdcheck.contracts.records import QuestionRecord, TokenLogprobs
from pdcheck.evals.jsonl import read_jsonl

__all__ = [
    "OnRecord",
    "QuestionRecord",
    "RecordWriter",
    "ShouldStop",
    "TokenLogprobs",
    "read_records",
]

# Told of every record once it is written (progress, live checks).
OnRecord = Callable[[QuestionRecord], None]
# Asked of every record once it is written; True ends the run early (see `arun_eval`).
ShouldStop = Callable[[QuestionRecord], bool]


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


def read_records(
    path: str | Path, *, indices: Container[int] | None = None
) -> list[QuestionRecord]:
    """The records of a records file in file order; with `indices`, only those questions.

    A torn last line (from a kill mid-write) is ignored. Any other line that is not a record
    raises `InputFileError` with the file, the line and what is wrong. With `indices`, lines of
    other questions are skipped unparsed (a GSM8K file with logprobs is tens of MB).
    """
    keep = None
    if indices is not None:

        def keep(line: bytes) -> bool:
            # `encode` writes the fields in order, so a line starts with its index.
            m = _INDEX_PREFIX.match(line)
            return m is None or int(m.group(1)) in indices

    return [
        record
        for _, record in read_jsonl(path, QuestionRecord, what=_A_RECORD, keep=keep)
        if indices is None or record.index in indices
    ]


_INDEX_PREFIX = re.compile(rb'\{"index":\s*(\d+)\s*,')
_A_RECORD = "a question record (one JSON object per line, as `pdcheck eval` writes)"
