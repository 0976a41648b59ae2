"""Records survive a kill: each line reaches the kernel in one write, and the JSON shape round-trips."""

from __future__ import annotations

from pdcheck.evals.records import QuestionRecord, RecordWriter, TokenLogprobs, read_records


def test_record_json_round_trips_with_logprobs(tmp_path):
    """A record written and read back is equal, logprobs and token ids included."""
    record = QuestionRecord(
        index=3,
        prompt_sha256="p",
        gold="18",
        ok=True,
        completion=" 18",
        token_ids=(1, 2),
        logprobs=(TokenLogprobs(" 18", -0.1, ((" 18", -0.1), (" 19", -2.0))),),
        answers={"vllm": "18"},
        correct=True,
    )
    with RecordWriter(tmp_path / "r.jsonl") as writer:
        writer.write(record)
    assert read_records(tmp_path / "r.jsonl") == [record]


def test_a_missing_logprob_is_written_as_null_and_read_back_as_none(tmp_path):
    """JSON has no NaN: a logprob the server did not give is null in the file and None when read."""
    record = QuestionRecord(
        index=0, prompt_sha256="p", gold="1", ok=True, logprobs=(TokenLogprobs("1", None),)
    )
    with RecordWriter(tmp_path / "r.jsonl") as writer:
        writer.write(record)
    assert '"logprobs":[["1",null,[]]]' in (tmp_path / "r.jsonl").read_text()
    assert read_records(tmp_path / "r.jsonl") == [record]


def test_write_many_appends_every_record_in_one_write(tmp_path, monkeypatch):
    """A batch of records goes to the kernel in one write(2) call, and reads back in order."""
    import os

    calls = []
    real_write = os.write
    monkeypatch.setattr(
        os, "write", lambda fd, data: calls.append(len(data)) or real_write(fd, data)
    )
    records = [QuestionRecord(index=i, prompt_sha256="x", gold="1", ok=True) for i in range(5)]
    with RecordWriter(tmp_path / "r.jsonl") as writer:
        writer.write_many(records)
        writer.write_many([])
    assert len(calls) == 1
    assert read_records(tmp_path / "r.jsonl") == records
