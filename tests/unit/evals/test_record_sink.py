"""The runner's record sink: records are written in batches off the request path, and none is lost to an error."""

from __future__ import annotations

import asyncio

import pytest

from pdcheck.evals.records import QuestionRecord, RecordWriter, read_records
from pdcheck.evals.runner import RecordSink


def _record(index: int) -> QuestionRecord:
    return QuestionRecord(index=index, prompt_sha256="x", gold="1", ok=True)


def _indices(path) -> list[int]:
    return [r.index for r in read_records(path)] if path.exists() else []


def test_batch_is_written_by_the_loop_not_by_add(tmp_path):
    """add() only queues; the loop writes what finished in one iteration, in one batch, before the next."""
    out = tmp_path / "r.jsonl"
    seen = []

    async def main():
        with RecordWriter(out) as writer:
            sink = RecordSink(writer, _record, on_record=lambda r: seen.append(r.index))
            for i in range(3):
                sink.add((i,))
            assert _indices(out) == [] and seen == [], "nothing written inside the finishing task"
            # The zero-delay timer runs in the loop's next iteration, after the callbacks already queued.
            await asyncio.sleep(0)
            await asyncio.sleep(0)
            assert _indices(out) == [0, 1, 2] and seen == [0, 1, 2]
            sink.close()

    asyncio.run(main())


def test_at_most_max_unwritten_records_wait(tmp_path):
    """The queue never holds max_unwritten finished questions: the one that fills it writes them all."""
    out = tmp_path / "r.jsonl"

    async def main():
        with RecordWriter(out) as writer:
            sink = RecordSink(writer, _record, on_record=None, max_unwritten=4)
            for i in range(3):
                sink.add((i,))
            assert _indices(out) == []
            sink.add((3,))
            assert _indices(out) == [0, 1, 2, 3]
            sink.close()

    asyncio.run(main())


def test_close_writes_the_queue(tmp_path):
    """close() (the runner calls it on success, error and Ctrl-C alike) writes what is still queued."""
    out = tmp_path / "r.jsonl"

    async def main():
        with RecordWriter(out) as writer:
            sink = RecordSink(writer, _record, on_record=None)
            sink.add((7,))
            sink.add((8,))
            sink.close()
            assert sink.records == [_record(7), _record(8)]

    asyncio.run(main())
    assert _indices(out) == [7, 8]


def test_a_failed_batch_stops_the_run_and_later_records_are_kept(tmp_path):
    """An error in a batch the loop wrote is raised by the next add(), and that question is still written on close."""
    out = tmp_path / "r.jsonl"
    calls = []

    def on_record(record):
        calls.append(record.index)
        if record.index == 0:
            raise RuntimeError("progress display broke")

    async def main():
        with RecordWriter(out) as writer:
            sink = RecordSink(writer, _record, on_record=on_record)
            sink.add((0,))
            await asyncio.sleep(0)
            await asyncio.sleep(0)
            with pytest.raises(RuntimeError, match="progress display broke"):
                sink.add((1,))
            sink.close()

    asyncio.run(main())
    assert _indices(out) == [0, 1] and calls == [0, 1]


def test_a_failed_last_batch_is_raised_by_close(tmp_path):
    """A batch that fails with no add() after it is raised by close(), never only logged by the loop."""

    class BrokenWriter:
        def write_many(self, records):
            raise OSError(28, "No space left on device")

    async def main():
        sink = RecordSink(BrokenWriter(), _record, on_record=None)
        sink.add((0,))
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        with pytest.raises(OSError, match="No space left"):
            sink.close()

    asyncio.run(main())
