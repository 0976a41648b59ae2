"""Reading only the diverging questions out of a records file."""

from __future__ import annotations

from pdcheck.evals.records import QuestionRecord
from pdcheck.report.details import read_questions


def _line(index: int) -> str:
    return (
        QuestionRecord(
            index=index, prompt_sha256="p", gold="1", ok=True, completion=f"c{index}"
        ).to_json()
        + "\n"
    )


def test_only_wanted_questions_are_returned_and_a_torn_line_is_ignored(tmp_path):
    """Wanted indices come back whole; others are skipped; a half-written last line never parses."""
    path = tmp_path / "records.jsonl"
    path.write_text("".join(_line(i) for i in range(5)) + _line(5)[:20])
    found = read_questions(path, {1, 3, 5, 9})
    assert sorted(found) == [1, 3]
    assert found[3].completion == "c3"
    assert read_questions(tmp_path / "missing.jsonl", {1}) == {}
