"""One `pdcheck sweep`: load and select cells, open the run folder, run the engine, finish up.

Everything a bad input can trip over (file, selection, shard, resume folder, attach URLs) is
checked here before anything starts or is written.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pdcheck.config import (
    Cell,
    SweepSpec,
    expand_cells,
    load_sweep,
    resolve_sweep_path,
    select_cells,
)
from pdcheck.config.schema import RaceSettings
from pdcheck.errors import ConfigError
from pdcheck.results.load import check_run, read_run_file
from pdcheck.results.schema import Selection, SweepInfo
from pdcheck.results.store import Provenance, RunStore, create_run
from pdcheck.serving.endpoints import Endpoints, attach
from pdcheck.sweep.backends import AttachBackend, Backend, BackendChoice, ray_settings
from pdcheck.sweep.edges import plan_cells
from pdcheck.sweep.engine import Engine, SweepOptions, SweepResult
from pdcheck.sweep.environments import (
    environment_records,
    prepare_environments,
    sweep_environments,
)
from pdcheck.sweep.events import EventSink, Progress
from pdcheck.sweep.judging import clean_tests
from pdcheck.sweep.race import RaceRun

logger = logging.getLogger(__name__)

DEFAULT_RESULTS_DIR = Path("pdcheck-results")


@dataclass(frozen=True)
class SweepRequest:
    """What the user asked for (the CLI's options, parsed)."""

    file: str | None = None
    out: Path | None = None
    resume: Path | None = None
    shard: tuple[int, int] | None = None
    only: tuple[str, ...] = ()
    keyword: str | None = None
    # Attach mode: the user's servers (checked by `pdcheck.serving.attach` in `prepare`).
    attach: Endpoints | None = None
    options: SweepOptions = field(default_factory=SweepOptions)
    # --backend, --ray-address, --ray-placement (over the sweep file's `ray` section).
    backend: BackendChoice = field(default_factory=BackendChoice)


@dataclass(frozen=True)
class PreparedSweep:
    spec: SweepSpec
    path: Path
    sha256: str
    cells: tuple[Cell, ...]
    out: Path
    resuming: bool
    attach: Endpoints | None = None  # checked and normalised
    # Clean tests over the whole selection (every shard): Holm's family.
    family_size: int = 0


def parse_shard(text: str) -> tuple[int, int]:
    """`i/n` with 1 ≤ i ≤ n, e.g. `2/4`."""
    i, sep, n = text.partition("/")
    if not (sep and i.isdigit() and n.isdigit() and 1 <= int(i) <= int(n)):
        raise ConfigError(f"--shard must be i/n with 1 ≤ i ≤ n (e.g. 1/4), got {text!r}")
    return int(i), int(n)


def shard_cells(cells: list[Cell], shard: tuple[int, int] | None) -> list[Cell]:
    """Cells of shard i of n, by the hash of the cell's id before its boundary prompts are
    planned: stable across machines and selections, whichever tokenizers a machine has."""
    if shard is None:
        return cells
    i, n = shard
    return [c for c in cells if int(_unplanned_id(c), 16) % n == i - 1]


def _unplanned_id(cell: Cell) -> str:
    return cell.model_copy(update={"eval": cell.eval.model_copy(update={"edge_plan": None})}).id


def default_sweep_file(*, has_gpus: bool) -> str:
    return "default-gpu" if has_gpus else "cpu-smoke"


def prepare(request: SweepRequest, *, fetch_tokenizers: bool = False) -> PreparedSweep:
    """Resolve file, cells and run folder; raises ConfigError (starting nothing) on bad input.

    `fetch_tokenizers` (a real run): hub models' tokenizer files are fetched for the boundary
    prompts' plan (`sweep.edges.plan_cells`), after the input has been checked."""
    file = request.file
    previous = read_run_file(request.resume) if request.resume else None
    if request.resume is not None:
        if previous is None:
            raise ConfigError(f"--resume {request.resume}: not a pdcheck run folder (no run.json)")
        check_run(request.resume)
    if file is None and previous is not None:
        file = previous.sweep.file
    if file is None:
        raise ConfigError("no sweep file given")
    path = resolve_sweep_path(file)
    sha = hashlib.sha256(path.read_bytes()).hexdigest()
    if previous is not None and previous.sweep.sha256 != sha:
        raise ConfigError(
            f"--resume {request.resume}: {path} changed since that run started (sha256 differs); "
            "resume with the same file, or start a new run with --out"
        )
    spec = load_sweep(path)
    selection = (previous.sweep.selection if previous else None) or Selection()
    only = request.only or selection.only
    keyword = request.keyword or selection.keyword
    shard = request.shard or selection.shard
    if request.resume is not None:
        out = request.resume
    else:
        stamp = datetime.now(UTC).strftime("%Y%m%d-%H%M%S")
        out = request.out or DEFAULT_RESULTS_DIR / f"{spec.name}-{stamp}"
        if out.exists() and any(out.iterdir()):
            raise ConfigError(
                f"--out {out} already holds files; use --resume {out} to continue that run, or a new folder"
            )
    selected = _select_planned(expand_cells(spec), only, keyword, fetch_tokenizers)
    cells = shard_cells(selected, shard)
    endpoints = None
    if request.attach is not None:  # the rules the CLI and pytest options were checked by
        endpoints = attach(
            baseline_url=request.attach.baseline_url,
            pd_url=request.attach.pd_url,
            decoder_metrics_urls=request.attach.decoder_metrics_urls,
        )
        check_attach_cells(cells)
    return PreparedSweep(
        spec,
        path,
        sha,
        tuple(cells),
        Path(out),
        request.resume is not None,
        attach=endpoints,
        family_size=clean_tests(selected),
    )


def _select_planned(
    cells: list[Cell], only: tuple[str, ...], keyword: str | None, fetch_tokenizers: bool
) -> list[Cell]:
    """The selected cells, planned (`sweep.edges`). A cell's id (its results folder's, its
    report row's) covers its boundary prompts, so `--only ID` selects among planned cells;
    selections by name plan only the cells they select (a bisect step names one)."""
    names = {cell.name for cell in cells}
    if all(wanted in names for wanted in only):
        chosen = select_cells(cells, only=only, keyword=keyword)
        return plan_cells(chosen, fetch_tokenizers=fetch_tokenizers)
    planned = plan_cells(cells, fetch_tokenizers=fetch_tokenizers)
    return select_cells(planned, only=only, keyword=keyword)


def check_attach_cells(cells: Sequence[Cell], *, how_to_pick: str = "--only NAME") -> None:
    """Attach mode tests exactly one cell: the user's servers are one configuration."""
    if len(cells) != 1:
        raise ConfigError(
            f"attach mode tests exactly one cell against your servers, but {len(cells)} are selected; "
            f"pick one with {how_to_pick} (cells: " + ", ".join(c.name for c in cells[:10]) + ")"
        )


def make_backend(request: SweepRequest, prepared: PreparedSweep) -> Backend:
    ray = ray_settings(prepared.spec.ray, request.backend)
    if prepared.attach is not None:
        if ray is not None:
            raise ConfigError(
                "attach mode tests your servers; it starts none on Ray (drop --backend ray)"
            )
        return AttachBackend(prepared.attach)
    if ray is not None:
        from pdcheck.sweep.ray_backend import RayBackend

        return RayBackend.connect(prepared.cells, ray)
    from pdcheck.sweep.serving_backend import ServingBackend

    return ServingBackend.for_cells(prepared.cells, run_dir=prepared.out)


def run_environment(*, attached: bool) -> tuple[dict[str, Any], Provenance]:
    """run.json's environment and the provenance every file is stamped with.

    Attached servers were not started by pdcheck, so their vLLM is not known here.
    """
    if attached:
        return {"attached": True}, Provenance()
    from pdcheck.serving.environment import collect_environment

    environment = collect_environment()
    vllm = environment["vllm"]
    return environment, Provenance(
        vllm_version=vllm.get("vllm_version"), vllm_commit=vllm.get("vllm_commit")
    )


def run_sweep(
    request: SweepRequest,
    *,
    on_event: EventSink | None = None,
    backend: Backend | None = None,
) -> SweepResult:
    """Run (or resume) a sweep; writes junit.xml, report.md and summary.json last.

    Without `backend`, pdcheck starts the servers itself, and first fetches the models they
    load, before any server's ready timer (or run folder) exists.
    """
    prepared = prepare(request, fetch_tokenizers=True)
    if backend is None and ray_settings(prepared.spec.ray, request.backend) is not None:
        from pdcheck.serving.ray_hosts import import_ray

        # Without Ray, exit 3 naming the extra before any model is fetched.
        import_ray()
    if backend is None and request.attach is None:
        from pdcheck.serving.weights import fetch_weights

        # Exit 3 before any server (or the run folder) exists: a missing model folder, a
        # requirement pip cannot install.
        prepare_environments(prepared.cells)

        weights = Progress(on_event)
        fetch_weights(prepared.cells, report=lambda message: weights.emit("weights", message))
    backend = backend or make_backend(request, prepared)
    environment, provenance = run_environment(attached=request.attach is not None)
    if request.attach is None and any(c.environment is not None for c in prepared.cells):
        environment = {**environment, "environments": environment_records(prepared.cells)}
    shard = request.shard
    store = create_run(
        prepared.out,
        provenance=provenance,
        environment=environment,
        shard=shard,
        sweep=SweepInfo(
            name=prepared.spec.name,
            file=str(prepared.path),
            sha256=prepared.sha256,
            cells=tuple(c.dirname for c in prepared.cells),
            selection=Selection(only=request.only, keyword=request.keyword, shard=shard),
        ),
    )
    # Holm's family is the whole selection, every shard's tests: a shard's early stops hold
    # when `pdcheck merge` applies Holm over all of them.
    options = replace(request.options, family_size=prepared.family_size)
    engine = Engine(
        prepared.cells, store=store, backend=backend, options=options, on_event=on_event
    )
    # The harness runs once per sweep and vLLM environment (each in its own python): in an
    # unsharded run or in shard 1, beside the servers.
    settings = prepared.spec.race
    run_race = request.attach is None and (shard is None or shard[0] == 1)
    harnesses = race_harnesses(settings, store, prepared.cells) if settings and run_race else []
    with contextlib.ExitStack() as stack:
        for harness in harnesses:
            stack.enter_context(harness)
        return engine.run(
            before_finish=functools.partial(_race, harnesses, store, engine) if harnesses else None,
        )


def race_harnesses(settings: RaceSettings, store: RunStore, cells: Sequence[Cell]) -> list[RaceRun]:
    """A harness per environment to start, but those whose verdict a resumed run already has."""
    harnesses = []
    for env in sweep_environments(cells):
        folder = store.race_folder(env.name)
        if not folder.joinpath("summary.json").is_file():
            harnesses.append(
                RaceRun(settings, python=env.python, out_dir=folder, environment=env.name)
            )
    return harnesses


def _race(harnesses: Sequence[RaceRun], store: RunStore, engine: Engine) -> None:
    engine.progress.phase = "race harness"
    engine.progress.emit("phase", "race harness")
    for harness in harnesses:
        race = harness.outcome()
        store.write_race_summary(race)
        where = f" on {harness.environment}" if harness.environment else ""
        engine.progress.emit("race", f"race harness{where}: {race.status} ({race.reason})")
