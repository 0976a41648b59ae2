"""GSM8K data: a local folder of test.jsonl/train.jsonl, the `datasets` hub cache, or gsm8k-synth.

Where the data comes from, in order: `EvalSettings.dataset`, then `$PDCHECK_GSM8K_DIR`, then
`datasets.load_dataset("openai/gsm8k", "main")` (which uses its own cache, so a machine that
downloaded it once works offline with `HF_HUB_OFFLINE=1`). The sha256 is taken over a canonical
serialization of the items, test then train, so the same data gives the same hash whichever way
it was loaded.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pdcheck.config import EvalSettings
from pdcheck.contracts import environment
from pdcheck.errors import DatasetError

logger = logging.getLogger(__name__)

GSM8K_DIR_ENV = environment.GSM8K_DIR.name
HUB_DATASET = ("openai/gsm8k", "main")
SPLIT_FILES = ("test.jsonl", "train.jsonl")
# gsm8k-synth sizes: the test split matches GSM8K's; the train split only feeds few-shot prompts.
SYNTH_SEED = 0
SYNTH_N_TEST = 1319
SYNTH_N_TRAIN = 1000

_HOW_TO_PROVIDE = (
    "Provide GSM8K in one of these ways: a folder with test.jsonl and train.jsonl given by "
    f"--dataset DIR (or `eval.dataset` in the sweep file) or by ${GSM8K_DIR_ENV}; or network access "
    "once so that `datasets` caches openai/gsm8k (it then works with HF_HUB_OFFLINE=1)."
)


@dataclass(frozen=True)
class Example:
    """One GSM8K item: the question and the worked answer ending in `#### N`."""

    question: str
    answer: str

    @property
    def final_answer(self) -> str:
        """The text after the last `#### ` marker (GSM8K's gold answer), stripped."""
        return self.answer.rsplit("####", 1)[-1].strip()


@dataclass(frozen=True)
class TaskData:
    """The loaded splits and where they came from; `test` is the full split (limit/offset apply later)."""

    task: str
    test: tuple[Example, ...]
    train: tuple[Example, ...]
    sha256: str
    source: str

    def indices(self, *, limit: int | None, offset: int) -> range:
        """The test indices a run with this limit/offset covers; an offset past the end is an error."""
        if offset >= len(self.test):
            raise DatasetError(
                f"offset {offset} is past the end of the {self.task} test split ({len(self.test)} questions)"
            )
        stop = len(self.test) if limit is None else min(len(self.test), offset + limit)
        return range(offset, stop)


def load_task(settings: EvalSettings) -> TaskData:
    """Load the task named by `settings.task`; raises DatasetError saying how to provide the data."""
    if settings.task == "gsm8k-synth":
        return _load_synth()
    folder = settings.dataset or os.environ.get(GSM8K_DIR_ENV)
    if folder:
        return _load_folder(Path(folder))
    return _load_hub()


def _canonical_sha256(test: tuple[Example, ...], train: tuple[Example, ...]) -> str:
    digest = hashlib.sha256()
    for split in (test, train):
        for ex in split:
            digest.update(json.dumps([ex.question, ex.answer], ensure_ascii=False).encode())
            digest.update(b"\n")
        digest.update(b"\x00")
    return digest.hexdigest()


def _examples(items: Iterable[Any], *, where: str) -> tuple[Example, ...]:
    out = []
    for i, item in enumerate(items):
        try:
            out.append(Example(question=item["question"], answer=item["answer"]))
        except (KeyError, TypeError):
            raise DatasetError(
                f"{where}: item {i} lacks a 'question' or 'answer' field; {_HOW_TO_PROVIDE}"
            ) from None
    return tuple(out)


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    items = []
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                items.append(json.loads(line))
            except json.JSONDecodeError as exc:
                raise DatasetError(f"{path}:{lineno}: not valid JSON ({exc.msg})") from None
    return items


def _make(
    task: str, test: tuple[Example, ...], train: tuple[Example, ...], source: str
) -> TaskData:
    if not test:
        raise DatasetError(f"{source}: the test split is empty. {_HOW_TO_PROVIDE}")
    return TaskData(
        task=task, test=test, train=train, sha256=_canonical_sha256(test, train), source=source
    )


def _load_folder(folder: Path) -> TaskData:
    missing = [name for name in SPLIT_FILES if not (folder / name).is_file()]
    if missing:
        raise DatasetError(f"GSM8K folder {folder} lacks {', '.join(missing)}. {_HOW_TO_PROVIDE}")
    test_path, train_path = (folder / name for name in SPLIT_FILES)
    test = _examples(_read_jsonl(test_path), where=str(test_path))
    train = _examples(_read_jsonl(train_path), where=str(train_path))
    return _make("gsm8k", test, train, source=str(folder.resolve()))


def _load_hub() -> TaskData:
    try:
        import datasets
    except ImportError:
        raise DatasetError(f"the `datasets` package is not installed. {_HOW_TO_PROVIDE}") from None
    name, config = HUB_DATASET
    try:
        loaded = datasets.load_dataset(name, config)
    except Exception as exc:  # datasets raises many types for "offline and not cached"
        raise DatasetError(
            f"could not load {name} ({config}) through `datasets`: {type(exc).__name__}: {exc}. {_HOW_TO_PROVIDE}"
        ) from exc
    test = _examples(loaded["test"], where=f"{name}/test")
    train = _examples(loaded["train"], where=f"{name}/train")
    return _make("gsm8k", test, train, source=f"hf:{name}/{config}")


def _load_synth() -> TaskData:
    try:
        from pdcheck.evals import synth
    except ImportError as exc:
        raise DatasetError(
            f"task gsm8k-synth needs pdcheck.evals.synth, which could not be imported: {exc}"
        ) from exc
    train, test = synth.generate(seed=SYNTH_SEED, n_train=SYNTH_N_TRAIN, n_test=SYNTH_N_TEST)
    return _make(
        "gsm8k-synth",
        _examples(test, where="gsm8k-synth/test"),
        _examples(train, where="gsm8k-synth/train"),
        source=f"pdcheck.evals.synth(seed={SYNTH_SEED})",
    )
