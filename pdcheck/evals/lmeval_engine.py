"""The lm-eval engine: lm-eval's own gsm8k (v3) through `local-completions`, as QuestionRecords.

This is what vLLM's PD accuracy gate runs. It exists so that pdcheck's numbers can be checked
against lm-eval's on the same server; pdcheck's own runner is faster and records more.

lm-eval always reads the very data pdcheck loaded: the selected test questions and the train
split are written to a temporary folder, and a task config derived from the installed
gsm8k.yaml (prompt, stop strings, filters and metric unchanged) points lm-eval at them with
`dataset_path: json`, so it works offline and with the same dataset sha256.

What lm-eval cannot give, the records leave empty: no X-Request-Id per question, no latency
or token counts, and a failed request is indistinguishable from an empty answer (lm-eval
scores both as wrong), so every record has `ok=True`.
"""

from __future__ import annotations

import asyncio
import json
import logging
import tempfile
from collections.abc import Iterable
from pathlib import Path
from types import ModuleType
from typing import Any

import aiohttp

from pdcheck.config import EvalSettings
from pdcheck.errors import ConfigError
from pdcheck.evals.client import base_url, fetch_model_name
from pdcheck.evals.dataset import Example, TaskData
from pdcheck.evals.extract import FLEXIBLE_EXTRACT, LMEVAL_INVALID, STRICT_MATCH, lmeval_normalize
from pdcheck.evals.prompts import prompt_sha256
from pdcheck.evals.records import QuestionRecord, RecordWriter, read_records
from pdcheck.evals.runner import EvalJob
from pdcheck.evals.summary import EvalSummary, summarize

logger = logging.getLogger(__name__)

TASK_NAME = "pdcheck_gsm8k_local"
_INSTALL_HINT = "the lm-eval engine needs lm-eval with its API extra: pip install 'lm-eval[api]'"


def run_lmeval(job: EvalJob) -> EvalSummary:
    """Run lm-eval's gsm8k on the job's questions and append their records to `job.out_path`.

    Questions already in the file are asked again (lm-eval cannot skip them) but not written
    twice. `job.run_tag` is unused: lm-eval sends no per-question request id. lm-eval asks every
    question before pdcheck sees one, so `job.should_stop` only ends the writing: the records
    after the stop are dropped and the summary covers those up to it. lm-eval cannot be
    interrupted mid-run either: `job.watchdog` runs before it starts and after it returns, so
    answers from a server that crashed meanwhile are never written.
    """
    try:
        import lm_eval
        import yaml
        from lm_eval.tasks import TaskManager
    except ImportError as exc:
        raise ConfigError(f"{_INSTALL_HINT} ({exc})") from exc
    task, settings, out_path, watchdog = job.task, job.settings, job.out_path, job.watchdog
    model = job.model or asyncio.run(_model_name(base_url(job.url)))
    indices = task.indices(limit=settings.limit, offset=settings.offset)
    if watchdog is not None:
        watchdog()
    with tempfile.TemporaryDirectory(prefix="pdcheck-lmeval-") as tmp:
        _write_task(Path(tmp), task, indices, settings=settings, yaml=yaml)
        results = lm_eval.simple_evaluate(
            model="local-completions",
            model_args={
                "model": model,
                "base_url": f"{base_url(job.url)}/v1/completions",
                "num_concurrent": job.concurrency,
                "tokenized_requests": False,
                "tokenizer_backend": None,
                "max_gen_toks": settings.max_tokens,
                "timeout": int(settings.request_timeout_s),
            },
            tasks=[TASK_NAME],
            num_fewshot=settings.shots,
            log_samples=True,
            task_manager=TaskManager(include_path=tmp),
        )
    if watchdog is not None:
        watchdog()
    if results is None:
        raise ConfigError(
            "lm-eval returned no results (it does so on non-zero ranks only); run it in one process"
        )
    records = samples_to_records(results["samples"][TASK_NAME], offset=indices.start)
    done = {r.index for r in read_records(out_path)} if out_path.exists() else set()
    stopped = False
    with RecordWriter(out_path) as writer:
        for n, record in enumerate(records, start=1):
            if record.index in done:
                continue
            writer.write(record)
            if job.on_record is not None:
                job.on_record(record)
            if job.should_stop is not None and job.should_stop(record):
                stopped, records = True, records[:n]
                break
    return summarize(
        records,
        wall_s=None,
        dataset_sha256=task.sha256,
        task=task.task,
        style="lm-eval",
        engine="lm-eval",
        limit=settings.limit,
        offset=settings.offset,
        concurrency=job.concurrency,
        model=model,
        stopped=stopped,
    )


def samples_to_records(samples: list[dict[str, Any]], *, offset: int = 0) -> list[QuestionRecord]:
    """lm-eval's logged samples (one per question and filter) as one QuestionRecord per question."""
    by_doc: dict[int, dict[str, dict[str, Any]]] = {}
    for sample in samples:
        by_doc.setdefault(sample["doc_id"], {})[sample["filter"]] = sample
    records = []
    for doc_id in sorted(by_doc):
        filters = by_doc[doc_id]
        strict = filters[STRICT_MATCH]
        answers = {
            name: None
            if filters[name]["filtered_resps"][0] == LMEVAL_INVALID
            else filters[name]["filtered_resps"][0]
            for name in (STRICT_MATCH, FLEXIBLE_EXTRACT)
            if name in filters
        }
        context = strict["arguments"][0][0]
        records.append(
            QuestionRecord(
                index=offset + doc_id,
                prompt_sha256=prompt_sha256(context),
                gold=lmeval_normalize(strict["doc"]["answer"]),
                ok=True,
                completion=strict["resps"][0][0],
                answer=answers[STRICT_MATCH],
                answers=answers,
                correct=bool(strict["exact_match"]),
                invalid=answers[STRICT_MATCH] is None,
            )
        )
    return records


def _write_task(
    folder: Path, task: TaskData, indices: range, *, settings: EvalSettings, yaml: ModuleType
) -> None:
    """The selected test questions, the train split, and a task config from lm-eval's own gsm8k.yaml."""
    test_file, train_file = folder / "test.jsonl", folder / "train.jsonl"
    _write_jsonl(test_file, [task.test[i] for i in indices])
    _write_jsonl(train_file, task.train)
    import lm_eval.tasks

    config = yaml.safe_load(
        (Path(lm_eval.tasks.__file__).parent / "gsm8k" / "gsm8k.yaml").read_text()
    )
    config.pop("tag", None)
    config.update(
        task=TASK_NAME,
        dataset_path="json",
        dataset_name=None,
        dataset_kwargs={"data_files": {"train": str(train_file), "test": str(test_file)}},
    )
    config["generation_kwargs"]["max_gen_toks"] = settings.max_tokens
    (folder / f"{TASK_NAME}.yaml").write_text(yaml.safe_dump(config, sort_keys=False))


def _write_jsonl(path: Path, examples: Iterable[Example]) -> None:
    with open(path, "w", encoding="utf-8") as f:
        for ex in examples:
            f.write(
                json.dumps({"question": ex.question, "answer": ex.answer}, ensure_ascii=False)
                + "\n"
            )


async def _model_name(root: str) -> str:
    async with aiohttp.ClientSession() as session:
        return await fetch_model_name(session, root)
