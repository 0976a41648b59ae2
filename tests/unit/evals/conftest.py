"""Small hand-made GSM8K-format tasks for the eval tests (real GSM8K is used where it matters)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pdcheck.evals.dataset import Example, TaskData


def make_task(n_test: int = 6, n_train: int = 8) -> TaskData:
    test = tuple(
        Example(f"What is {i} + {i}?", f"{i} + {i} = {2 * i}\n#### {2 * i}") for i in range(n_test)
    )
    train = tuple(Example(f"Train question {i}?", f"It is {i}.\n#### {i}") for i in range(n_train))
    return TaskData(task="gsm8k", test=test, train=train, sha256="0" * 64, source="test")


def write_folder(folder: Path, task: TaskData) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for name, split in (("test.jsonl", task.test), ("train.jsonl", task.train)):
        with open(folder / name, "w") as f:
            for ex in split:
                f.write(json.dumps({"question": ex.question, "answer": ex.answer}) + "\n")
    return folder


@pytest.fixture
def small_task() -> TaskData:
    return make_task()
