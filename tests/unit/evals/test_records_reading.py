"""Reading records files: a malformed file is refused with its path, line and problem, never a traceback.

Property-based: valid files are cut short, garbled with random bytes, or given lines of valid JSON
of the wrong shape, and fed to `read_records` and to `pdcheck compare`.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pdcheck.errors import ExitCode, InputFileError
from pdcheck.evals.records import QuestionRecord, RecordWriter, TokenLogprobs, read_records
from tests.unit.analysis.builders import injection_line
from tests.unit.bad_files import BAD_FILES, fresh_dir, garbled, run_cli, truncated, wrong_typed


def _record(index: int, *, correct: bool = True) -> QuestionRecord:
    return QuestionRecord(
        index=index,
        prompt_sha256="p" * 8,
        gold="18",
        ok=True,
        completion=" 18 é",
        token_ids=(5, 6),
        logprobs=(
            TokenLogprobs(" 18", -0.1, ((" 18", -0.1), (" 19", -2.5))),
            TokenLogprobs(" é", None, ()),
        ),
        answers={"vllm": "18", "flexible": None},
        correct=correct,
        latency_s=0.25,
    )


RECORDS = [_record(i) for i in range(4)]
LINES = [r.encode() + b"\n" for r in RECORDS]
FILE = b"".join(LINES)


def _write(root: Path, data: bytes) -> Path:
    path = fresh_dir(root) / "records.jsonl"
    path.write_bytes(data)
    return path


def _read_or_refuse(path: Path) -> list[QuestionRecord] | InputFileError:
    """What `read_records` gives: records, or InputFileError naming the file and a line. Any other
    exception fails the test."""
    try:
        return read_records(path)
    except InputFileError as exc:
        assert re.match(rf"{re.escape(str(path))}:\d+: ", str(exc)), str(exc)
        assert exc.path == str(path) and exc.line is not None
        return exc


@BAD_FILES
@given(cut=st.integers(0, len(FILE)))
def test_a_file_cut_anywhere_reads_as_the_records_it_holds_whole(tmp_path, cut):
    """A kill mid-write leaves a torn last line: it is skipped, never an error. Every record whose
    line is whole (its line end may be missing) reads back unchanged."""
    whole = sum(1 for end in _line_ends() if cut >= end - 1)
    assert read_records(_write(tmp_path, FILE[:cut])) == RECORDS[:whole]


def _line_ends() -> list[int]:
    ends, at = [], 0
    for line in LINES:
        at += len(line)
        ends.append(at)
    return ends


@BAD_FILES
@given(line=st.sampled_from(range(len(LINES) - 1)), data=st.data())
def test_a_line_cut_short_before_the_last_is_refused_with_its_line_number(tmp_path, line, data):
    """A record cut short with more lines after it is not a torn write but a broken file."""
    cut = data.draw(st.integers(1, len(LINES[line]) - 2))
    broken = [*LINES[:line], LINES[line][:cut] + b"\n", *LINES[line + 1 :]]
    path = _write(tmp_path, b"".join(broken))
    with pytest.raises(
        InputFileError, match=rf"{re.escape(str(path))}:{line + 1}: not a JSON line"
    ):
        read_records(path)


@BAD_FILES
@given(data=garbled(FILE) | truncated(FILE) | st.binary(max_size=300))
def test_garbled_bytes_give_records_or_a_refusal_naming_the_line(tmp_path, data):
    """Random bytes anywhere (invalid UTF-8, NUL, stray brackets): records, or InputFileError."""
    _read_or_refuse(_write(tmp_path, data))


@BAD_FILES
@given(line=st.sampled_from(range(len(LINES))), data=st.data())
def test_a_line_of_the_wrong_shape_is_refused_at_that_line(tmp_path, line, data):
    """A line of valid JSON with a wrong type, a missing or an extra field: if it is still a record
    it reads typed (it round-trips), otherwise InputFileError names that line."""
    doc = data.draw(wrong_typed(json.loads(LINES[line])))
    lines = [*LINES]
    lines[line] = json.dumps(doc).encode() + b"\n"
    path = _write(tmp_path, b"".join(lines))
    got = _read_or_refuse(path)
    if isinstance(got, InputFileError):
        assert got.line == line + 1
    else:
        again = _write(tmp_path, b"".join(r.encode() + b"\n" for r in got))
        assert read_records(again) == got


def test_a_missing_field_names_the_field_and_the_line(tmp_path):
    """The message says what is wrong, in the record's own terms."""
    path = tmp_path / "r.jsonl"
    doc = json.loads(LINES[1])
    del doc["gold"]
    path.write_bytes(LINES[0] + json.dumps(doc).encode() + b"\n")
    with pytest.raises(InputFileError, match=r"r.jsonl:2: not a question record.*`gold`"):
        read_records(path)


def test_a_missing_logprob_reads_as_none_and_nan_literals_of_old_files_still_read(tmp_path):
    """null is None, not NaN; files from before msgspec (json module: NaN and -Infinity literals)
    read, their NaN (a logprob the server did not give) as None too."""
    path = tmp_path / "r.jsonl"
    line = json.loads(LINES[0])
    line["logprobs"] = [[" 18", None, [[" 18", -0.1], [" 19", None]]]]
    old = dict(line, logprobs=[[" 18", float("nan"), [[" 18", -0.1], [" 19", float("-inf")]]]])
    path.write_text(json.dumps(line) + "\n" + json.dumps(old | {"index": 1}) + "\n")
    first, second = read_records(path)
    assert first.logprobs == (TokenLogprobs(" 18", None, ((" 18", -0.1), (" 19", None))),)
    assert second.logprobs is not None and second.logprobs[0].top[1][1] == float("-inf")
    assert second.logprobs[0].logprob is None


def test_indices_skip_other_questions_and_a_torn_line(tmp_path):
    """With `indices`, only those questions come back; a torn last line of a wanted question is skipped."""
    path = tmp_path / "r.jsonl"
    path.write_bytes(FILE + LINES[0][:30])
    assert [r.index for r in read_records(path, indices={1, 3, 9})] == [1, 3]


# -- through the CLI ---------------------------------------------------------------------------


def _compare_files(root: Path, pd_data: bytes) -> tuple[Path, Path]:
    folder = fresh_dir(root)
    baseline, pd = folder / "baseline.jsonl", folder / "pd.jsonl"
    with RecordWriter(baseline) as writer:
        writer.write_many(_record(i) for i in range(30))
    pd.write_bytes(pd_data)
    return baseline, pd


_PD_FILE = b"".join(_record(i, correct=i % 2 == 0).encode() + b"\n" for i in range(30))


@BAD_FILES
@given(
    data=garbled(_PD_FILE)
    | st.builds(
        lambda doc, rest: json.dumps(doc).encode() + b"\n" + rest,
        wrong_typed(json.loads(LINES[0])),
        st.just(_PD_FILE),
    )
)
def test_compare_on_a_malformed_record_file_exits_3_naming_file_and_line(tmp_path, data):
    """`pdcheck compare` never shows a traceback or exits 1 (a CI gate's "PD regressed") on a
    malformed file: it exits 3 naming the file and the line, or reads what is valid."""
    baseline, pd = _compare_files(tmp_path, data)
    code, output = run_cli("compare", str(baseline), str(pd), "--json")
    assert "Traceback" not in output
    if code == ExitCode.CONFIG:
        assert re.search(rf"{re.escape(str(pd))}:\d+: ", output) or re.search(
            "different questions|twice", output
        ), output


def test_compare_on_a_line_that_is_not_json_exits_3(tmp_path):
    """The issue's case: one line that is not JSON gave a traceback and exit 1."""
    baseline, pd = _compare_files(tmp_path, _PD_FILE.replace(b'{"index":3,', b'{"index":3,,', 1))
    code, output = run_cli("compare", str(baseline), str(pd))
    assert code == ExitCode.CONFIG and f"{pd}:4: not a JSON line" in output, output
    assert "Traceback" not in output


@pytest.mark.parametrize(
    ("line", "problem"),
    [
        (b"not json\n", "not a JSON line"),
        (b'{"request_id": "r"}\n', "missing required field `x_request_id`"),
        (injection_line("no-index"), "does not end in -q<index>"),
    ],
)
def test_a_malformed_injection_log_exits_3_naming_its_line(tmp_path, line, problem):
    """`compare --injections` reads the plugin's log line by line, typed, like the records."""
    baseline, pd = _compare_files(tmp_path, _PD_FILE)
    log = tmp_path / "injections.jsonl"
    log.write_bytes(injection_line("run-q00001") + line)
    code, output = run_cli("compare", str(baseline), str(pd), "--injections", str(log))
    assert code == ExitCode.CONFIG and f"{log}:2: " in output and problem in output, output
