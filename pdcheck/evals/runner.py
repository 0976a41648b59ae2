"""The eval runner: every question of a task against one URL at an exact concurrency.

Concurrency is one semaphore around the request, as in vLLM's benchmark client, not a
connection-pool limit: at concurrency N exactly N requests are in flight while N or more
remain, which is what the PD races need. The time a question waits for the semaphore is
recorded apart (`queue_s`) from its latency. A one-request preflight runs first and aborts
the run with the server's own error, before anything is written.

Records go to the JSONL file as they finish, in batches of what finished in one event-loop
iteration (`RecordSink`); a rerun with the same file skips the questions already there, after
checking they were asked with the same prompts, and asks the rest.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import aiohttp
import uvloop

from pdcheck.config import EvalSettings
from pdcheck.errors import ConfigError, InfraError
from pdcheck.evals.client import CompletionRequest, Outcome, base_url, complete, fetch_model_name
from pdcheck.evals.dataset import Example, TaskData
from pdcheck.evals.extract import gold_answer, score
from pdcheck.evals.prompts import PromptBuilder, PromptOptions
from pdcheck.evals.records import OnRecord, QuestionRecord, RecordWriter, ShouldStop, read_records
from pdcheck.evals.summary import EvalSummary, summarize

logger = logging.getLogger(__name__)

# Checks the servers while an eval runs: raises to end the eval (e.g. ServerCrashed).
Watchdog = Callable[[], None]
# How often: a crashed server fails the run within this, instead of its requests' timeouts.
WATCHDOG_INTERVAL_S = 0.5

# The most finished questions held without a record: what a SIGKILL can lose (resume asks them again).
MAX_UNWRITTEN = 64


def request_id(run_tag: str, index: int) -> str:
    """The X-Request-Id of question `index`; analysis maps ids back to questions by `-q(\\d+)$`."""
    return f"{run_tag}-q{index:05d}"


@dataclass(frozen=True)
class EvalJob:
    """One eval: a task's selected questions against one URL at one concurrency, into one records
    file. What every engine takes (`run_eval` builds it from its keywords)."""

    url: str
    task: TaskData
    settings: EvalSettings
    concurrency: int
    out_path: Path
    model: str | None = None  # None: ask the server's /v1/models
    run_tag: str = "eval"
    on_record: OnRecord | None = None
    should_stop: ShouldStop | None = None
    watchdog: Watchdog | None = None


def run_eval(
    url: str,
    task: TaskData,
    *,
    settings: EvalSettings,
    concurrency: int,
    out_path: str | Path,
    model: str | None = None,
    run_tag: str = "eval",
    on_record: OnRecord | None = None,
    should_stop: ShouldStop | None = None,
    watchdog: Watchdog | None = None,
) -> EvalSummary:
    """Run the eval with the engine `settings.engine` names; the fields are `EvalJob`'s and their
    meaning `arun_eval`'s."""
    job = EvalJob(
        url,
        task,
        settings,
        concurrency,
        Path(out_path),
        model=model,
        run_tag=run_tag,
        on_record=on_record,
        should_stop=should_stop,
        watchdog=watchdog,
    )
    if settings.engine == "lm-eval":
        from pdcheck.evals.lmeval_engine import run_lmeval

        return run_lmeval(job)
    # uvloop, as vLLM's own clients and pdcheck's proxy use: it takes ~30 µs of client CPU off
    # every question (benchmarks/bench_eval.py shows the floor on both loops).
    return uvloop.run(arun_eval(job))


async def arun_eval(
    job: EvalJob,
    *,
    max_attempts: int = 3,
    now: Callable[[], float] = time.perf_counter,
) -> EvalSummary:
    """Ask every selected question once, append records to `job.out_path`, and summarize the file's records.

    `job.should_stop` sees each record once it is written; the first True cancels the questions
    still asked or waiting, writes those that had finished, and returns the summary of the records
    on file with `stopped` set (a resumed run asks the rest). `job.watchdog` is called every
    `WATCHDOG_INTERVAL_S` while questions are asked; what it raises ends the run the same way and
    is raised (a crashed server fails the run at once, not after its requests time out).
    `job.model` None asks the server's /v1/models. Raises InfraError if the preflight request
    fails, ConfigError if `job.out_path` holds records asked with other prompts.
    """
    task, settings, concurrency, out_path = job.task, job.settings, job.concurrency, job.out_path
    run_tag, model = job.run_tag, job.model
    if concurrency < 1:
        raise ConfigError(f"concurrency must be at least 1, got {concurrency}")
    builder = PromptBuilder(task, PromptOptions.from_settings(settings))
    indices = task.indices(limit=settings.limit, offset=settings.offset)
    previous = _previous_records(out_path, builder, indices)
    todo = [i for i in indices if i not in previous]
    root = base_url(job.url)
    fresh: list[QuestionRecord] = []
    wall_s: float | None = None
    stopped = False
    connector = aiohttp.TCPConnector(limit=0, force_close=False)
    async with aiohttp.ClientSession(connector=connector) as session:
        model = model or await fetch_model_name(session, root)
        if todo:
            builder = await _preflight(
                session,
                builder,
                todo[0],
                root=root,
                model=model,
                run_tag=run_tag,
                timeout_s=settings.request_timeout_s,
            )
            endpoint = root + builder.options.path
            style = builder.options.style
            semaphore = asyncio.Semaphore(concurrency)
            start = now()

            def record_of(index: int, rid: str, queue_s: float, outcome: Outcome) -> QuestionRecord:
                return to_record(
                    index,
                    task.test[index],
                    outcome,
                    style=style,
                    prompt_sha256=builder.prompt_sha256(index),
                    queue_s=queue_s,
                    request_id=rid,
                )

            async def ask(index: int, sink: RecordSink) -> None:
                async with semaphore:
                    queue_s = now() - start
                    body = builder.body(builder.prompt(index), model=model)
                    req = CompletionRequest(endpoint, body, request_id(run_tag, index))
                    outcome = await complete(
                        session,
                        req,
                        timeout_s=settings.request_timeout_s,
                        max_attempts=max_attempts,
                        now=now,
                    )
                sink.add((index, req.request_id, queue_s, outcome))

            with RecordWriter(out_path) as writer:
                sink = RecordSink(
                    writer, record_of, on_record=job.on_record, should_stop=job.should_stop
                )
                tasks = [asyncio.ensure_future(ask(i, sink)) for i in todo]
                everything = asyncio.gather(*tasks)
                # Cancelled by a stop, the gather ends with a CancelledError nobody awaits: mark it
                # retrieved, or asyncio logs it as lost.
                everything.add_done_callback(lambda f: f.cancelled() or f.exception())
                stop = asyncio.ensure_future(sink.stop.wait())
                watch = asyncio.ensure_future(_watch(job.watchdog))
                try:
                    await asyncio.wait(
                        (everything, stop, watch), return_when=asyncio.FIRST_COMPLETED
                    )
                    if watch.done():
                        watch.result()  # raises what the watchdog raised
                    if everything.done():
                        everything.result()  # raises the first question's error
                finally:
                    # On a stop, an error or Ctrl-C, end the questions still running before the
                    # file is closed, and write the ones that finished.
                    stop.cancel()
                    watch.cancel()
                    for t in tasks:
                        t.cancel()
                    await asyncio.gather(*tasks, return_exceptions=True)
                    sink.close()
                fresh = sink.records
                stopped = sink.stop.is_set()
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
        stopped=stopped,
    )


async def _watch(watchdog: Watchdog | None) -> None:
    """Call `watchdog` every `WATCHDOG_INTERVAL_S` until cancelled or it raises."""
    while True:
        if watchdog is not None:
            watchdog()
        await asyncio.sleep(WATCHDOG_INTERVAL_S)


def to_record(
    index: int,
    example: Example,
    outcome: Outcome,
    *,
    style: str,
    prompt_sha256: str,
    queue_s: float | None,
    request_id: str | None,
) -> QuestionRecord:
    """A question's record from its request's outcome; a failed request is an error, never a wrong answer."""
    gold = gold_answer(style, example.answer)
    scored = score(style, outcome.text, gold) if outcome.ok and outcome.text is not None else None
    return QuestionRecord(
        index=index,
        prompt_sha256=prompt_sha256,
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


class RecordSink:
    """Builds and appends the records of finished questions in batches, off the request path.

    When a question's request finishes it releases its semaphore slot, but the next question's
    request is sent only when the loop next runs the task that was waiting. Scoring, hashing,
    encoding and writing the record in the finishing task would put all that work (for every
    question finished in the same loop iteration) before those sends, leaving the server idle.
    So `add` only queues the outcome, and the batch is built and written by a zero-delay timer:
    the loop runs it after the callbacks already queued, i.e. after the released tasks have sent
    their requests. One write(2) per batch instead of one per record.

    Crash safety: what a SIGKILL can lose is the queue, the questions finished since the last
    flush: at most `max_unwritten`, queued for at most one loop iteration. They have no record,
    so a resumed run asks them again. `close()` writes the queue, on success and on error alike.

    `should_stop` sees each written record until it returns True; then `stop` is set and the run
    ends (`arun_eval` cancels the rest).
    """

    def __init__(
        self,
        writer: RecordWriter,
        build: Callable[..., QuestionRecord],
        *,
        on_record: OnRecord | None,
        should_stop: ShouldStop | None = None,
        max_unwritten: int = MAX_UNWRITTEN,
    ):
        self.records: list[QuestionRecord] = []
        self.stop = asyncio.Event()
        self._should_stop = should_stop
        self._writer = writer
        self._build = build
        self._on_record = on_record
        self._max_unwritten = max_unwritten
        self._queue: list[tuple[Any, ...]] = []
        self._timer: asyncio.TimerHandle | None = None
        self._error: Exception | None = None

    def add(self, finished: tuple[Any, ...]) -> None:
        """Queue `build(*finished)`; raises a failure of an earlier batch (this one stays queued for close)."""
        self._queue.append(finished)
        self._raise_error()
        if len(self._queue) >= self._max_unwritten:
            self.flush()
        elif self._timer is None:
            self._timer = asyncio.get_running_loop().call_later(0, self._flush_from_loop)

    def flush(self) -> None:
        """Build the queued records, append them in one write, then report them to `on_record`."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        batch, self._queue = self._queue, []
        records = [self._build(*finished) for finished in batch]
        self._writer.write_many(records)
        self.records.extend(records)
        for record in records:
            if self._on_record is not None:
                self._on_record(record)
            if (
                self._should_stop is not None
                and not self.stop.is_set()
                and self._should_stop(record)
            ):
                self.stop.set()

    def close(self) -> None:
        """Write what is queued, unless a batch already failed; raise that failure if no add() did."""
        if self._error is None:
            self.flush()
        self._raise_error()

    def _flush_from_loop(self) -> None:
        self._timer = None
        try:
            self.flush()
        except (
            Exception
        ) as exc:  # a loop callback's exception would only be logged: hand it to the run
            self._error = exc

    def _raise_error(self) -> None:
        error, self._error = self._error, None
        if error is not None:
            raise error


def _previous_records(
    out_path: Path, builder: PromptBuilder, indices: range
) -> dict[int, QuestionRecord]:
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
        if record.prompt_sha256 != builder.prompt_sha256(record.index):
            raise ConfigError(
                f"{out_path} holds question {record.index} asked with a different prompt (other style, shots or data); "
                "resume it with the same settings or write to a new --out file"
            )
        if record.ok and record.index not in previous:
            previous[record.index] = record
            kept.append(record)
    if len(kept) != len(existing) or _ends_torn(out_path):
        _rewrite(out_path, kept)
    logger.info(
        "resuming %s: %d of %d questions already done", out_path, len(previous), len(indices)
    )
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
        writer.write_many(records)
    tmp.replace(path)


async def _preflight(
    session: aiohttp.ClientSession,
    builder: PromptBuilder,
    index: int,
    *,
    root: str,
    model: str,
    run_tag: str,
    timeout_s: float,
) -> PromptBuilder:
    """Send one 1-token request; returns the builder to use (without token ids if the server refuses them)."""
    endpoint = root + builder.options.path
    body = builder.body(builder.prompt(index), model=model, max_tokens=1)
    outcome = await complete(
        session, CompletionRequest(endpoint, body, f"{run_tag}-preflight"), timeout_s=timeout_s
    )
    if (
        not outcome.ok
        and builder.options.token_ids
        and outcome.http_status == 400
        and "return_token" in (outcome.error or "")
    ):
        logger.info(
            "%s refuses vLLM's return_token_ids/return_tokens_as_token_ids; asking without them",
            endpoint,
        )
        builder = PromptBuilder(builder.task, replace(builder.options, token_ids=False))
        body = builder.body(builder.prompt(index), model=model, max_tokens=1)
        outcome = await complete(
            session, CompletionRequest(endpoint, body, f"{run_tag}-preflight"), timeout_s=timeout_s
        )
    if not outcome.ok:
        raise InfraError(
            f"the preflight request to {endpoint} (model {model!r}) failed, so nothing was run: {outcome.error}"
        )
    return builder
