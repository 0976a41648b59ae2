"""Plan each cell's block-boundary prompts (`eval.edges`) before anything starts.

The block size is the one the cell's servers run with: `--block-size` in its serve args, else
vLLM's default for the platform. A Mamba/GDN hybrid's attention block size is vLLM's aligned
one (`Platform._align_hybrid_block_size` raises it until an attention page holds a Mamba state
page); for the tiny hybrids on CPU that leaves 128 (their logs say only "Padding mamba page
size"), and a hybrid whose alignment raises it should give `--block-size` the aligned size.
The plan goes into the cell's eval settings, so the baseline and PD sides ask the same prompts
and the cell's id names them.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from pdcheck.config import Cell
from pdcheck.config.schema import EdgePlan
from pdcheck.errors import ConfigError

if TYPE_CHECKING:
    from pdcheck.serving.weights import HubModel

logger = logging.getLogger(__name__)

# vLLM's block size when none is given: the CPU attention backend's, and CacheConfig's default.
DEFAULT_BLOCK_SIZE = {"cpu": 128, "gpu": 16}


def block_size(cell: Cell) -> int:
    """The attention block size the cell's servers run with (see the module docstring)."""
    from pdcheck.serving.argv import flag_value, user_serve_args

    given = flag_value(user_serve_args(cell), "--block-size")
    if given is not None:
        try:
            return int(given)
        except ValueError:
            raise ConfigError(
                f"{cell.name}: --block-size {given!r} is not a whole number of tokens"
            ) from None
    return DEFAULT_BLOCK_SIZE[_platform(cell)]


def _platform(cell: Cell) -> str:
    if cell.serving.platform != "auto":
        return cell.serving.platform
    from pdcheck.serving.gpus import read_inventory

    return "gpu" if read_inventory().count else "cpu"


def plan_cells(cells: Sequence[Cell], *, fetch_tokenizers: bool = False) -> list[Cell]:
    """`cells` with each `eval.edges` cell's `edge_plan` filled in; a cell whose tokenizer is
    not on this machine keeps none (the dry run says why, the report that it has none).

    `fetch_tokenizers`: a hub model's tokenizer files (not its weights) are fetched first, as a
    real run does, so its first run on a machine plans as every later one; a dry run fetches
    nothing (offline without HF_HUB_OFFLINE, each fetch waits out the Hub's retries)."""
    return [_planned(cell, fetch_tokenizers) for cell in cells]


def _planned(cell: Cell, fetch_tokenizers: bool) -> Cell:
    if not cell.eval.edges or cell.eval.edge_plan is not None:
        return cell
    plan = _plan_or_why_not(cell, fetch_tokenizers)
    if isinstance(plan, str):
        return cell
    return cell.model_copy(update={"eval": cell.eval.model_copy(update={"edge_plan": plan})})


def _plan_or_why_not(cell: Cell, fetch_tokenizers: bool) -> EdgePlan | str:
    from pdcheck.serving.weights import hub_models

    hub = hub_models([cell])
    return _cached_plan(
        cell.model.path,
        hub[0] if hub else None,
        fetch_tokenizers,
        cell.model.kind == "hybrid",
        block_size(cell),
        _room(cell),
        cell.eval.model_dump_json(),
    )


def _tokenizer_source(path: str, hub: HubModel | None, fetch: bool) -> str:
    """Where the tokenizer loads from: a hub model's snapshot folder in the cache its servers
    read (at their `--revision`), else the model's own path; TokenizerMissing when a hub
    model's is not in that cache (and, with `fetch`, could not be fetched)."""
    from pdcheck.evals.edges import TokenizerMissing

    if hub is None:
        return path
    folder = _cached_tokenizer_folder(hub, fetch)
    if isinstance(folder, str):
        then = "" if fetch else "; a real run fetches its tokenizer files first"
        raise TokenizerMissing(folder + then)
    return str(folder)


@functools.cache
def _cached_tokenizer_folder(model: HubModel, fetch: bool) -> Path | str:
    """The folder, or why not: a failure is kept too, as each try offline waits out retries."""
    from pdcheck.evals.edges import TokenizerMissing
    from pdcheck.serving.weights import tokenizer_folder

    try:
        return tokenizer_folder(model, download=fetch)
    except OSError as exc:
        return str(TokenizerMissing.of(exc))


def _room(cell: Cell) -> int | None:
    """What max-model-len leaves a prompt after the completion, if max-model-len is given."""
    from pdcheck.serving.argv import flag_value, user_serve_args

    given = flag_value(user_serve_args(cell), "--max-model-len")
    return int(given) - cell.eval.max_tokens if given and given.isdigit() else None


@functools.cache
def _cached_plan(
    path: str,
    hub: HubModel | None,
    fetch: bool,
    hybrid: bool,
    size: int,
    room: int | None,
    eval_json: str,
) -> EdgePlan | str:
    """The plan, or why there is none (the tokenizer cannot be loaded here), worked out and
    logged once: the dry run's coverage line asks again."""
    from pdcheck.config.schema import EvalSettings
    from pdcheck.evals import load_task
    from pdcheck.evals.edges import TokenizerMissing, plan_edges, token_counter
    from pdcheck.evals.prompts import PromptBuilder, PromptOptions

    settings = EvalSettings.model_validate_json(eval_json)
    try:
        count = token_counter(_tokenizer_source(path, hub, fetch), settings)
    except TokenizerMissing as exc:
        logger.warning("no block-boundary prompts for %s: %s", path, exc)
        return f"the model's tokenizer is not on this machine: {exc}"
    task = load_task(settings)
    builder = PromptBuilder(task, PromptOptions.from_settings(settings))
    window = task.indices(limit=settings.limit, offset=settings.offset)
    return plan_edges(
        task, builder, window, count, block_size=size, hybrid=hybrid, max_tokens_in=room
    )


def coverage_line(cell: Cell) -> str:
    """The dry run's line: what the plan's prompts cover, or why the cell has none."""
    from pdcheck.evals.edges import planned_coverage

    if not cell.eval.edges:
        return "block-boundary coverage: off (eval.edges is false)"
    if cell.eval.edge_plan is None:
        why = _plan_or_why_not(cell, False)
        return f"block-boundary coverage: none ({why if isinstance(why, str) else 'not planned'})"
    return planned_coverage(cell.eval.edge_plan).describe()
