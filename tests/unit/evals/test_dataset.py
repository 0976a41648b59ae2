"""GSM8K loading: local folder or env variable, a source-independent sha256, and clear errors."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from pdcheck.config import EvalSettings
from pdcheck.errors import DatasetError
from pdcheck.evals.dataset import Example, load_task
from tests.unit.evals.conftest import write_folder


def test_local_folder_loads_both_splits(tmp_path, small_task):
    """A folder of test.jsonl/train.jsonl given by the settings is loaded in file order."""
    write_folder(tmp_path, small_task)
    task = load_task(EvalSettings(dataset=str(tmp_path)))
    assert task.test == small_task.test and task.train == small_task.train
    assert task.source == str(tmp_path.resolve())


def test_env_variable_names_the_folder(tmp_path, small_task, monkeypatch):
    """$PDCHECK_GSM8K_DIR is used when the settings name no folder."""
    write_folder(tmp_path, small_task)
    monkeypatch.setenv("PDCHECK_GSM8K_DIR", str(tmp_path))
    assert load_task(EvalSettings()).test == small_task.test


def test_sha256_depends_on_content_not_formatting(tmp_path, small_task):
    """The same items written with other JSON spacing hash the same; a changed answer hashes differently."""
    a = write_folder(tmp_path / "a", small_task)
    b = tmp_path / "b"
    b.mkdir()
    for name, split in (("test.jsonl", small_task.test), ("train.jsonl", small_task.train)):
        (b / name).write_text(
            "".join(
                json.dumps(
                    {"answer": e.answer, "question": e.question}, indent=None, separators=(",", ":")
                )
                + "\n"
                for e in split
            )
        )
    sha_a = load_task(EvalSettings(dataset=str(a))).sha256
    assert sha_a == load_task(EvalSettings(dataset=str(b))).sha256
    changed = replace(small_task, test=(*small_task.test[:-1], Example("q", "#### 1")))
    assert (
        load_task(EvalSettings(dataset=str(write_folder(tmp_path / "c", changed)))).sha256 != sha_a
    )


def test_real_gsm8k_folder(gsm8k_dir):
    """The shared GSM8K copy has GSM8K's split sizes and a stable hash."""
    task = load_task(EvalSettings(dataset=gsm8k_dir))
    assert (len(task.test), len(task.train)) == (1319, 7473)
    assert task.test[0].final_answer == "18"
    assert task.sha256 == "a7646ca2fdd317687f46091461395def81c5c62cacfe4dc6c5bc075fcf014448"


def test_missing_files_say_how_to_provide_them(tmp_path):
    """A folder without the split files fails with the missing names and the ways to provide GSM8K."""
    (tmp_path / "test.jsonl").write_text("")
    with pytest.raises(DatasetError, match=r"lacks train\.jsonl.*PDCHECK_GSM8K_DIR"):
        load_task(EvalSettings(dataset=str(tmp_path)))


def test_bad_json_line_is_located(tmp_path, small_task):
    """A corrupt line names its file and line number."""
    write_folder(tmp_path, small_task)
    with open(tmp_path / "test.jsonl", "a") as f:
        f.write("{not json\n")
    with pytest.raises(DatasetError, match=r"test\.jsonl:7"):
        load_task(EvalSettings(dataset=str(tmp_path)))


def test_limit_and_offset_select_indices(small_task):
    """limit takes the first N from offset; an offset past the end is an error."""
    assert small_task.indices(limit=None, offset=0) == range(0, 6)
    assert small_task.indices(limit=2, offset=3) == range(3, 5)
    assert small_task.indices(limit=100, offset=4) == range(4, 6)
    with pytest.raises(DatasetError, match="past the end"):
        small_task.indices(limit=None, offset=6)


def test_synth_task_loads_from_the_generator():
    """gsm8k-synth comes from pdcheck.evals.synth, in GSM8K's format, with a deterministic hash."""
    a, b = load_task(EvalSettings(task="gsm8k-synth")), load_task(EvalSettings(task="gsm8k-synth"))
    assert a.task == "gsm8k-synth" and len(a.test) == 1319 and len(a.train) == 1000
    assert a.sha256 == b.sha256
    assert a.test[0].answer.rsplit("####", 1)[-1].strip().isdigit()
