"""Small hand-made GSM8K-format tasks for the eval tests (real GSM8K is used where it matters)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pdcheck.config import EvalSettings
from pdcheck.evals import EvalSummary, read_records, run_eval
from pdcheck.evals.dataset import Example, TaskData
from tests.fakes.openai_server import FakeOpenAIServer, echo_completion


def make_task(n_test: int = 6, n_train: int = 8) -> TaskData:
    test = tuple(
        Example(f"What is {i} + {i}?", f"{i} + {i} = {2 * i}\n#### {2 * i}") for i in range(n_test)
    )
    train = tuple(Example(f"Train question {i}?", f"It is {i}.\n#### {i}") for i in range(n_train))
    return TaskData(task="gsm8k", test=test, train=train, sha256="0" * 64, source="test")


def answer_right(body):
    """Answers 'What is i + i?' correctly, from the last question in the prompt."""
    question = body["prompt"].rsplit("Question: What is ", 1)[1]
    i = int(question.split(" ", 1)[0])
    return echo_completion(body, text=f" {i} + {i} = {2 * i}.\n#### {2 * i}")


def asked_indices(server: FakeOpenAIServer) -> list[int]:
    """The questions a fake server was asked, from their X-Request-Id (the preflight aside)."""
    return sorted(
        int(h["X-Request-ID"].rsplit("q", 1)[1])
        for h in server.headers
        if "-q" in h["X-Request-ID"]
    )


def rerun_asks_exactly_the_missing(out: Path, n_test: int, *, concurrency: int) -> EvalSummary:
    """Rerun `make_task(n_test)` on the records file `out` an earlier run left: the rerun asks
    exactly the questions without a record, and then every question has one."""
    kept = {r.index for r in read_records(out)}
    with FakeOpenAIServer(answer_right) as server:
        summary = run_eval(
            server.url,
            make_task(n_test=n_test),
            settings=EvalSettings(shots=1),
            concurrency=concurrency,
            out_path=out,
            model="m",
        )
        asked = asked_indices(server)
    assert asked == sorted(set(range(n_test)) - kept), "the rerun asks exactly the missing ones"
    assert sorted(r.index for r in read_records(out)) == list(range(n_test))
    assert summary.n == n_test and not summary.stopped
    return summary


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
