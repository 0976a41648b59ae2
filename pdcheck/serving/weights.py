"""Fetch each hub model a sweep's servers load, once, before any server starts.

vLLM downloads missing weights inside its own start, so a first run spent the download inside
the ready timeout (the Qwen3.5-35B repro: about 67 GB for each server). pdcheck fetches each
model first, into the huggingface_hub cache the servers read, with huggingface_hub's own
progress bars, and says before it starts how much it will download: the sizes, from the Hub's
file metadata, of the files not yet in the cache.

The files are those vLLM 0.32 and 0.33 read (`download_weights_from_hf`): the weights in the
first format of safetensors, bin and pt the repository has, without `original/` (LoadConfig's
default `ignore_patterns`), and the configuration, tokenizer and code files beside them.
Fixture models and local paths need nothing. A server environment with HF_HUB_OFFLINE set
downloads nothing, so the cache must hold the model already; a model the Hub does not have
(or will not show) and an offline model missing from the cache are bad input (exit 3).
"""

from __future__ import annotations

import fnmatch
import logging
import os
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from pdcheck.config import Cell
from pdcheck.config.paths import FIXTURE_PREFIX
from pdcheck.errors import ConfigError, InfraError
from pdcheck.serving.argv import flag_value, user_serve_args

log = logging.getLogger(__name__)

# vLLM's order of weight formats, and what it never loads from a hub repository.
WEIGHT_PATTERNS = ("*.safetensors", "*.bin", "*.pt")
IGNORE_PATTERNS = ("original/*",)
# Configuration, tokenizer, chat template and remote code: read by transformers at start.
SIDE_FILE_PATTERNS = ("*.json", "*.txt", "*.model", "*.tiktoken", "*.jinja", "*.py")
_TRUE = ("1", "ON", "YES", "TRUE")
# What a tokenizer is loaded from: configuration, vocabulary, merges, chat template; no weights.
TOKENIZER_PATTERNS = ("*.json", "*.txt", "*.model", "*.tiktoken", "*.jinja")


@dataclass(frozen=True)
class HubModel:
    """One repository at one revision, in the cache the servers read, and the sweep's names for it."""

    repo_id: str
    revision: str | None
    cache_dir: str | None  # None: huggingface_hub's default cache
    offline: bool  # HF_HUB_OFFLINE in the servers' environment
    token: str | None
    names: tuple[str, ...]

    @property
    def label(self) -> str:
        at = f"@{self.revision}" if self.revision else ""
        return f"{self.repo_id}{at} ({', '.join(self.names)})"


@dataclass(frozen=True)
class Download:
    """What fetching one model takes: the files vLLM reads, how many are missing and their size."""

    model: HubModel
    allow_patterns: tuple[str, ...]
    files: int | None  # None: not known (offline, or the Hub unreachable)
    missing_files: int
    missing_bytes: int
    note: str = ""

    def describe(self) -> str:
        if self.files is None:
            return f"{self.model.label}: in the cache, nothing to download ({self.note})"
        if not self.missing_files:
            return f"{self.model.label}: all {self.files} files in the cache, nothing to download"
        return (
            f"{self.model.label}: {format_size(self.missing_bytes)} to download "
            f"({self.missing_files} of {self.files} files not in the cache)"
        )


def hub_models(cells: Iterable[Cell], *, environ: dict[str, str] | None = None) -> list[HubModel]:
    """The distinct hub repositories the cells' servers load; fixtures and local paths are none.

    The revision and download folder come from the serve args (`--revision`,
    `--download-dir`); the cache, token and offline switch from the servers' environment: the
    inherited one, then the cell's env, then the model's (the layers `build_env` applies).
    """
    inherited = dict(os.environ) if environ is None else environ
    found: dict[tuple[str, str | None, str | None, bool, str | None], list[str]] = {}
    for cell in cells:
        path = cell.model.path
        if path.startswith(FIXTURE_PREFIX) or os.path.isabs(path) or os.path.isdir(path):
            continue
        env = {**inherited, **cell.env, **cell.model.env}
        args = user_serve_args(cell)
        cache = flag_value(args, "--download-dir") or _hub_cache(env)
        offline = env.get("HF_HUB_OFFLINE", "").upper() in _TRUE
        key = (path, flag_value(args, "--revision"), cache, offline, env.get("HF_TOKEN"))
        names = found.setdefault(key, [])
        if cell.model.name not in names:
            names.append(cell.model.name)
    return [HubModel(*key, names=tuple(names)) for key, names in found.items()]


def tokenizer_folder(model: HubModel, *, download: bool) -> Path:
    """The cache's snapshot folder of `model` with its tokenizer files, fetched first (a few MB,
    no weights) when `download` and the servers' environment is not offline; raises OSError
    when the cache does not hold it and it cannot be fetched."""
    import huggingface_hub

    return Path(
        huggingface_hub.snapshot_download(
            model.repo_id,
            revision=model.revision,
            cache_dir=model.cache_dir,
            token=model.token,
            allow_patterns=list(TOKENIZER_PATTERNS),
            local_files_only=model.offline or not download,
        )
    )


def _hub_cache(env: dict[str, str]) -> str | None:
    if env.get("HF_HUB_CACHE"):
        return env["HF_HUB_CACHE"]
    if env.get("HF_HOME"):
        return str(Path(env["HF_HOME"]) / "hub")
    return None


def plan_download(model: HubModel) -> Download:
    """How much fetching `model` downloads, from the Hub's file metadata, or the cache offline.

    Raises ConfigError (exit 3) when the Hub has no such repository or revision (or will not
    show it without a token), or when it is offline and not in the cache; InfraError when the
    Hub cannot be reached and the cache does not hold the model.
    """
    import huggingface_hub
    from huggingface_hub.errors import (
        DryRunError,
        HfHubHTTPError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    if model.offline:
        return _cached(model, note="HF_HUB_OFFLINE is set: sizes not checked")
    try:
        infos = huggingface_hub.snapshot_download(
            model.repo_id,
            revision=model.revision,
            cache_dir=model.cache_dir,
            token=model.token,
            ignore_patterns=list(IGNORE_PATTERNS),
            dry_run=True,
        )
    except RevisionNotFoundError:
        raise ConfigError(
            f"model {model.label}: the Hub has no revision {model.revision!r} of {model.repo_id}; "
            "fix --revision in the serve args"
        ) from None
    except DryRunError as exc:
        cause = exc.__cause__
        denied = isinstance(cause, HfHubHTTPError) and cause.response.status_code == 401
        if isinstance(cause, RepositoryNotFoundError) or denied:
            raise ConfigError(
                f"model {model.label}: the Hugging Face Hub has no repository {model.repo_id!r}, "
                "or it is private or gated and this machine has no token with access to it; fix "
                "the model's path, or log in (`hf auth login`, or HF_TOKEN in the environment)"
            ) from None
        try:
            return _cached(model, note=f"the Hub could not be reached: {cause or exc}")
        except ConfigError:
            raise InfraError(
                f"model {model.label}: the Hugging Face Hub could not be reached ({cause or exc}) "
                "and the model is not in the cache; check the network, or fetch it once where "
                "the Hub is reachable"
            ) from None
    names = [info.filename for info in infos]
    allow = (*_weights_pattern(names), *SIDE_FILE_PATTERNS)
    wanted = [info for info in infos if _matches(info.filename, allow)]
    missing = [info for info in wanted if info.will_download]
    return Download(
        model,
        allow_patterns=allow,
        files=len(wanted),
        missing_files=len(missing),
        missing_bytes=sum(info.file_size or 0 for info in missing),
    )


def _weights_pattern(names: Sequence[str]) -> tuple[str, ...]:
    """vLLM's choice: the first weight format the repository has (none: it has no weights)."""
    for pattern in WEIGHT_PATTERNS:
        if fnmatch.filter(names, pattern):
            return (pattern,)
    return ()


def _matches(name: str, allow: Sequence[str]) -> bool:
    ignored = any(fnmatch.fnmatch(name, p) for p in IGNORE_PATTERNS)
    return not ignored and any(fnmatch.fnmatch(name, p) for p in allow)


def _cached(model: HubModel, *, note: str) -> Download:
    """A model the cache holds (its config and weights), or ConfigError naming it."""
    from huggingface_hub import try_to_load_from_cache

    config = try_to_load_from_cache(
        model.repo_id, "config.json", cache_dir=model.cache_dir, revision=model.revision
    )
    folder = Path(config).parent if isinstance(config, str) else None
    names = [p.name for p in folder.iterdir()] if folder is not None else []
    if folder is None or not _weights_pattern(names):
        where = model.cache_dir or "huggingface_hub's default cache"
        raise ConfigError(
            f"model {model.label}: not in the Hugging Face cache ({where}) with its weights, and "
            f"nothing may be downloaded ({note}); fetch it once with the Hub reachable and "
            "HF_HUB_OFFLINE unset, or point the model's path at a local copy"
        )
    return Download(
        model,
        allow_patterns=(*_weights_pattern(names), *SIDE_FILE_PATTERNS),
        files=None,
        missing_files=0,
        missing_bytes=0,
        note=note,
    )


def fetch_weights(
    cells: Iterable[Cell],
    *,
    report: Callable[[str], None] = log.info,
    environ: dict[str, str] | None = None,
) -> list[Download]:
    """Fetch every hub model of `cells` into the cache, each once; what each took is reported
    first (all of them are checked before anything downloads, so a bad one stops the sweep
    before any byte or server). huggingface_hub draws its own progress bars."""
    import huggingface_hub

    downloads = [plan_download(model) for model in hub_models(cells, environ=environ)]
    total = sum(d.missing_bytes for d in downloads)
    for download in downloads:
        report(f"weights: {download.describe()}")
    if total:
        report(f"weights: downloading {format_size(total)} before any server starts")
    for download in downloads:
        if not download.missing_files:
            continue
        model = download.model
        try:
            huggingface_hub.snapshot_download(
                model.repo_id,
                revision=model.revision,
                cache_dir=model.cache_dir,
                token=model.token,
                allow_patterns=list(download.allow_patterns),
                ignore_patterns=list(IGNORE_PATTERNS),
            )
        except OSError as exc:  # hf's HTTP, connection and file errors are all OSErrors
            raise InfraError(f"model {model.label}: downloading its weights failed: {exc}") from exc
        report(f"weights: {model.label} fetched")
    return downloads


def describe_weights(cells: Iterable[Cell]) -> tuple[list[str], list[str]]:
    """What `fetch_weights` would download, for `--dry-run`: (lines, problems in the sweep).

    A model the Hub does not have is a problem of the sweep file. An offline model missing from
    this machine's cache is a fact of this machine, not of the sweep (a dry run in CI or on a
    laptop checks a GPU sweep whose weights live elsewhere): the line says a run here would
    stop, and the dry run does not fail on it."""
    lines: list[str] = []
    problems: list[str] = []
    for model in hub_models(cells):
        try:
            lines.append(plan_download(model).describe())
        except ConfigError as exc:
            if not model.offline:
                problems.append(str(exc))
            lines.append(f"a run here would stop (exit 3): {exc}")
        except InfraError as exc:
            lines.append(f"cannot tell: {exc}")
    return lines, problems


def format_size(n: int) -> str:
    """Decimal units, as huggingface_hub's bars show them."""
    for unit, size in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= size:
            return f"{n / size:.2f} {unit}"
    return f"{n} B"
