"""The eval runner: every question of a task against one URL at an exact concurrency.

Concurrency is one semaphore around the request, as in vLLM's benchmark client, not a
connection-pool limit: at concurrency N exactly N requests are in flight while N or more
remain, which is what the PD races need. The time a question waits for the semaphore is
recorded apart (`queue_s`) from its latency. A one-request preflight runs first and aborts
the run with the server's own error, before anything is written.

Records go to the JSONL file as they finish (`RecordWriter`); a rerun with the same file
skips the questions already there, after checking they were asked with the same prompts.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import aiohttp

from pdcheck.config import EvalSettings
from pdcheck.errors import ConfigError, InfraError
from pdcheck.evals.client import CompletionRequest, Outcome, base_url, complete, fetch_model_name
from pdcheck.evals.dataset import Example, TaskData
from pdcheck.evals.extract import gold_answer, score
from pdcheck.evals.prompts import PromptBuilder, PromptOptions, prompt_sha256
from pdcheck.evals.records import QuestionRecord, RecordWriter, read_records
from pdcheck.evals.summary import EvalSummary, summarize

logger = logging.getLogger(__name__)

OnRecord = Callable[[QuestionRecord], None]


def request_id(run_tag: str, index: int) -> str:
    """The X-Request-Id of question `index`; analysis maps ids back to questions by `-q(\\d+)$`."""
    return f"{run_tag}-q{index:05d}"


def run_eval(url: str, task: TaskData, *, settings: EvalSettings, **options: Any) -> EvalSummary:
    """Run the eval with the engine `settings.engine` names; the options are `arun_eval`'s.

    (`concurrency`, `out_path`, `model`, `run_tag`, `on_record`; the lm-eval engine takes only these.)
    """
    if settings.engine == "lm-eval":
        from pdcheck.evals.lmeval_engine import run_lmeval

        return run_lmeval(url, task, settings=settings, **options)
    return asyncio.run(arun_eval(url, task, settings=settings, **options))


async def arun_eval(
    url: str,
    task: TaskData,
    *,
    settings: EvalSettings,
    concurrency: int,
    out_path: str | Path,
    model: str | None = None,
    run_tag: str = "eval",
    on_record: OnRecord | None = None,
    max_attempts: int = 3,
    now: Callable[[], float] = time.perf_counter,
) -> EvalSummary:
    """Ask every selected question once, append records to `out_path`, and summarize the file's records.

    `model` None asks the server's /v1/models. Raises InfraError if the preflight request fails, ConfigError if `out_path` holds
    records asked with other prompts.
    """
    if concurrency < 1:
        raise ConfigError(f"concurrency must be at least 1, got {concurrency}")
    out_path = Path(out_path)
    builder = PromptBuilder(task, PromptOptions.from_settings(settings))
    indices = task.indices(limit=settings.limit, offset=settings.offset)
    previous = _previous_records(out_path, builder, indices)
    todo = [i for i in indices if i not in previous]
    root = base_url(url)
    fresh: list[QuestionRecord] = []
    wall_s: float | None = None
    connector = aiohttp.TCPConnector(limit=0, force_close=False)
    async with aiohttp.ClientSession(connector=connector) as session:
        model = model or await fetch_model_name(session, root)
        if todo:
            builder = await _preflight(
                session, builder, todo[0], root=root, model=model, run_tag=run_tag, timeout_s=settings.request_timeout_s
            )
            endpoint = root + builder.options.path
            style = builder.options.style
            semaphore = asyncio.Semaphore(concurrency)
            start = now()

            async def ask(index: int, writer: RecordWriter) -> None:
                async with semaphore:
                    queue_s = now() - start
                    prompt = builder.prompt(index)
                    req = CompletionRequest(endpoint, builder.body(prompt, model=model), request_id(run_tag, index))
                    outcome = await complete(
                        session, req, timeout_s=settings.request_timeout_s, max_attempts=max_attempts, now=now
                    )
                record = to_record(
                    index, task.test[index], outcome, style=style, prompt=prompt, queue_s=queue_s, request_id=req.request_id
                )
                writer.write(record)
                fresh.append(record)
                if on_record is not None:
                    on_record(record)

            with RecordWriter(out_path) as writer:
                await asyncio.gather(*(ask(i, writer) for i in todo))
            wall_s = now() - start
    records = sorted([*previous.values(), *fresh], key=lambda r: r.index)
    return summarize(
        records,
        timed=fresh,
        wall_s=wall_s,
        dataset_sha256=task.sha256,
        task=task.task,
        style=settings.style,
        engine="pdcheck",
        limit=settings.limit,
        offset=settings.offset,
        concurrency=concurrency,
        model=model,
    )


def to_record(
    index: int, example: Example, outcome: Outcome, *, style: str, prompt: str, queue_s: float | None, request_id: str | None
) -> QuestionRecord:
    """A question's record from its request's outcome; a failed request is an error, never a wrong answer."""
    gold = gold_answer(style, example.answer)
    scored = score(style, outcome.text, gold) if outcome.ok and outcome.text is not None else None
    return QuestionRecord(
        index=index,
        prompt_sha256=prompt_sha256(prompt),
        gold=gold,
        ok=outcome.ok,
        completion=outcome.text,
        token_ids=outcome.token_ids,
        logprobs=outcome.logprobs,
        finish_reason=outcome.finish_reason,
        prompt_tokens=outcome.prompt_tokens,
        completion_tokens=outcome.completion_tokens,
        latency_s=outcome.latency_s,
        queue_s=queue_s,
        answer=scored.answer if scored else None,
        answers=scored.answers if scored else {},
        correct=scored.correct if scored else False,
        invalid=scored.invalid if scored else False,
        error=outcome.error,
        http_status=outcome.http_status,
        attempts=outcome.attempts,
        request_id=request_id,
    )


def _previous_records(out_path: Path, builder: PromptBuilder, indices: range) -> dict[int, QuestionRecord]:
    """Answered records already in the file for these indices, checked to be asked with our prompts.

    Failed records (`ok=False`) in range, and a torn last line, are dropped from the file (rewritten
    whole, then renamed over it), so failed questions are asked again without leaving two records
    for one index.
    """
    if not out_path.exists():
        return {}
    kept: list[QuestionRecord] = []
    previous: dict[int, QuestionRecord] = {}
    existing = read_records(out_path)
    for record in existing:
        if record.index not in indices:
            kept.append(record)
            continue
        if record.prompt_sha256 != prompt_sha256(builder.prompt(record.index)):
            raise ConfigError(
                f"{out_path} holds question {record.index} asked with a different prompt (other style, shots or data); "
                "resume it with the same settings or write to a new --out file"
            )
        if record.ok and record.index not in previous:
            previous[record.index] = record
            kept.append(record)
    if len(kept) != len(existing) or _ends_torn(out_path):
        _rewrite(out_path, kept)
    logger.info("resuming %s: %d of %d questions already done", out_path, len(previous), len(indices))
    return previous


def _ends_torn(path: Path) -> bool:
    """True if the file ends inside a line (a kill mid-write): appending there would corrupt a record."""
    with open(path, "rb") as f:
        f.seek(0, 2)
        if f.tell() == 0:
            return False
        f.seek(-1, 2)
        return f.read(1) != b"\n"


def _rewrite(path: Path, records: list[QuestionRecord]) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.unlink(missing_ok=True)
    with RecordWriter(tmp) as writer:
        for record in records:
            writer.write(record)
    tmp.replace(path)


async def _preflight(
    session: aiohttp.ClientSession, builder: PromptBuilder, index: int, *, root: str, model: str, run_tag: str, timeout_s: float
) -> PromptBuilder:
    """Send one 1-token request; returns the builder to use (without token ids if the server refuses them)."""
    endpoint = root + builder.options.path
    body = builder.body(builder.prompt(index), model=model, max_tokens=1)
    outcome = await complete(session, CompletionRequest(endpoint, body, f"{run_tag}-preflight"), timeout_s=timeout_s)
    if not outcome.ok and builder.options.token_ids and outcome.http_status == 400 and "return_token" in (outcome.error or ""):
        logger.info("%s refuses vLLM's return_token_ids/return_tokens_as_token_ids; asking without them", endpoint)
        builder = PromptBuilder(builder.task, replace(builder.options, token_ids=False))
        body = builder.body(builder.prompt(index), model=model, max_tokens=1)
        outcome = await complete(session, CompletionRequest(endpoint, body, f"{run_tag}-preflight"), timeout_s=timeout_s)
    if not outcome.ok:
        raise InfraError(f"the preflight request to {endpoint} (model {model!r}) failed, so nothing was run: {outcome.error}")
    return builder
