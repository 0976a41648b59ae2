"""`pdcheck eval`: GSM8K against one OpenAI-compatible URL, with per-question records and a progress bar."""

from __future__ import annotations

import json
import time
from pathlib import Path

import click
import msgspec
from pydantic import ValidationError
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn
from rich.table import Table

from pdcheck.cli._common import console, err_console
from pdcheck.config import EvalSettings
from pdcheck.config.schema import ENGINES, STYLES, TASKS
from pdcheck.errors import ConfigError, ExitCode
from pdcheck.evals import EvalSummary, QuestionRecord, load_task, read_records, run_eval


def _json_object(ctx: click.Context, param: click.Parameter, value: str | None) -> dict | None:
    if value is None:
        return None
    try:
        parsed = json.loads(value)
    except ValueError as exc:
        raise click.BadParameter(f"not JSON: {exc}") from None
    if not isinstance(parsed, dict):
        raise click.BadParameter("must be a JSON object, e.g. '{\"enable_thinking\": false}'")
    return parsed


class _ProgressBar:
    """done/total, running accuracy, questions/s and ETA, updated from the runner's on_record."""

    def __init__(self, progress: Progress, total: int, done: int):
        self.progress = progress
        self.done = self.correct = self.errors = 0
        self.start = time.perf_counter()
        self.task = progress.add_task("gsm8k", total=total, completed=done, stats="")

    def __call__(self, record: QuestionRecord) -> None:
        self.done += 1
        self.correct += record.correct
        self.errors += not record.ok
        answered = self.done - self.errors
        acc = f"acc {100 * self.correct / answered:.1f}%" if answered else "acc -"
        rate = self.done / max(time.perf_counter() - self.start, 1e-9)
        errors = f" [red]{self.errors} errors[/red]" if self.errors else ""
        self.progress.update(self.task, advance=1, stats=f"{acc}  {rate:.1f} q/s{errors}")


def _summary_table(summary: EvalSummary, out: Path) -> Table:
    table = Table(title=f"{summary.task} ({summary.style} style, {summary.engine} engine) -> {out}")
    table.add_column("metric")
    table.add_column("value", justify="right")

    def fmt(value, pattern: str) -> str:
        return "-" if value is None else pattern.format(value)

    rows = [
        ("questions", str(summary.n)),
        ("accuracy", fmt(summary.accuracy, "{:.4f}")),
        ("invalid rate", fmt(summary.invalid_rate, "{:.4f}")),
        ("error rate", fmt(summary.error_rate, "{:.4f}")),
        ("questions/s", fmt(summary.questions_per_s, "{:.2f}")),
        ("output tokens/s", fmt(summary.output_tokens_per_s, "{:.1f}")),
        ("latency p50 (s)", fmt(summary.latency_p50_s, "{:.3f}")),
        ("latency p99 (s)", fmt(summary.latency_p99_s, "{:.3f}")),
        ("model", summary.model or "-"),
        ("dataset sha256", summary.dataset_sha256[:16]),
    ]
    for name, value in rows:
        table.add_row(name, value)
    return table


@click.command(name="eval")
@click.option(
    "--url", required=True, help="Server root, e.g. http://127.0.0.1:8000 (a /v1 suffix is fine)."
)
@click.option(
    "--concurrency",
    type=click.IntRange(min=1),
    default=64,
    show_default=True,
    help="Requests in flight, exactly.",
)
@click.option("--limit", type=click.IntRange(min=1), help="Ask only this many test questions.")
@click.option(
    "--offset",
    type=click.IntRange(min=0),
    default=0,
    show_default=True,
    help="Skip this many test questions first.",
)
@click.option(
    "--style",
    type=click.Choice(STYLES),
    default="vllm",
    show_default=True,
    help="Whose prompt and scoring to use.",
)
@click.option(
    "--engine",
    type=click.Choice(ENGINES),
    default="pdcheck",
    show_default=True,
    help="pdcheck's runner or lm-eval's.",
)
@click.option("--task", "task_name", type=click.Choice(TASKS), default="gsm8k", show_default=True)
@click.option(
    "--dataset",
    type=click.Path(file_okay=False),
    help="Folder with test.jsonl/train.jsonl (else $PDCHECK_GSM8K_DIR).",
)
@click.option("--model", help="Model name to send (default: the server's first /v1/models id).")
@click.option(
    "--logprobs", is_flag=True, help="Record the top-2 logprobs of every generated token."
)
@click.option("--shots", type=click.IntRange(min=0, max=20), default=5, show_default=True)
@click.option("--max-tokens", type=click.IntRange(min=1), default=256, show_default=True)
@click.option(
    "--timeout",
    "timeout_s",
    type=click.FloatRange(min=0, min_open=True),
    default=600.0,
    show_default=True,
    help="Per-request timeout in seconds.",
)
@click.option(
    "--chat-template-kwargs",
    callback=_json_object,
    help="JSON object for the chat style, e.g. '{\"enable_thinking\": false}'.",
)
@click.option(
    "--no-stop",
    is_flag=True,
    help="Send no stop strings (thinking models write them in their reasoning).",
)
@click.option(
    "--run-tag", default="eval", show_default=True, help="X-Request-Id prefix: <run-tag>-q<index>."
)
@click.option(
    "--out",
    required=True,
    type=click.Path(dir_okay=False, path_type=Path),
    help="Records JSONL; an existing file is resumed.",
)
@click.option(
    "--summary-out",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Also write the summary as JSON here.",
)
def eval_cmd(
    url,
    concurrency,
    limit,
    offset,
    style,
    engine,
    task_name,
    dataset,
    model,
    logprobs,
    shots,
    max_tokens,
    timeout_s,
    chat_template_kwargs,
    no_stop,
    run_tag,
    out,
    summary_out,
) -> None:
    """Run GSM8K against URL at an exact concurrency and append one record per question to --out."""
    try:
        settings = EvalSettings(
            task=task_name,
            dataset=dataset,
            limit=limit,
            offset=offset,
            shots=shots,
            max_tokens=max_tokens,
            style=style,
            engine=engine,
            logprobs=logprobs,
            request_timeout_s=timeout_s,
            chat_template_kwargs=chat_template_kwargs,
            no_stop=no_stop,
        )
    except ValidationError as exc:
        raise ConfigError(str(exc)) from None
    if engine == "lm-eval" and style != "lm-eval":
        raise ConfigError(
            "--engine lm-eval runs lm-eval's own gsm8k prompt; use it with --style lm-eval"
        )
    if chat_template_kwargs is not None and style != "chat":
        raise ConfigError("--chat-template-kwargs applies to --style chat only")
    task = load_task(settings)
    indices = task.indices(limit=limit, offset=offset)
    done = sum(1 for r in read_records(out) if r.index in indices and r.ok) if out.exists() else 0
    columns = (
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[stats]}"),
        TimeRemainingColumn(),
    )
    with Progress(*columns, console=err_console, transient=False) as progress:
        summary = run_eval(
            url,
            task,
            settings=settings,
            concurrency=concurrency,
            out_path=out,
            model=model,
            run_tag=run_tag,
            on_record=_ProgressBar(progress, len(indices), done),
        )
    if summary_out is not None:
        summary_out.write_text(json.dumps(msgspec.to_builtins(summary), indent=2) + "\n")
    console.print(_summary_table(summary, out))
    if summary.error_rate > 0:
        failed = round(summary.error_rate * summary.n)
        err_console.print(
            f"{failed} of {summary.n} questions failed (see `error` in {out}); "
            "run the same command again to retry only those."
        )
        raise click.exceptions.Exit(int(ExitCode.INFRA))
