"""Where pdcheck finds its shipped data (sweeps, fixtures) and keeps things outside it (the model
and vLLM-fixes caches), and how a file there or in a run folder is written whole."""

from __future__ import annotations

import hashlib
import importlib.resources
import os
import re
import tempfile
from collections.abc import Iterable
from pathlib import Path

from pdcheck.config.schema import EnvironmentSpec, ModelSpec
from pdcheck.contracts import environment
from pdcheck.errors import ConfigError

FIXTURE_PREFIX = "fixture:"


def shipped_dir(name: str) -> Path:
    """The folder `name` (`sweeps` or `fixtures`) shipped inside the installed pdcheck package.

    Read through importlib.resources so a wheel finds its own copy wherever it is installed. In
    the repo, pdcheck/data/<name> is a link to the top-level folder, the one source of truth;
    the wheel and sdist carry real files there.
    """
    folder = importlib.resources.files("pdcheck") / "data" / name
    if not isinstance(folder, Path):
        # Model weights are copied and hashed as files; a zipped install cannot serve them.
        raise RuntimeError(
            f"pdcheck's {name} data is not on the file system ({folder!r}); install pdcheck unzipped"
        )
    return folder


def cache_dir() -> Path:
    """$PDCHECK_CACHE_DIR, else $XDG_CACHE_HOME/pdcheck, else ~/.cache/pdcheck."""
    if env := os.environ.get(environment.CACHE_DIR.name):
        return Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "pdcheck"


def fixture_models_dir() -> Path:
    return cache_dir() / "models"


def resolve_model_path(path: str) -> str:
    """`fixture:<name>` → the built tiny model's directory; anything else is returned unchanged."""
    if path.startswith(FIXTURE_PREFIX):
        return str(fixture_models_dir() / path[len(FIXTURE_PREFIX) :])
    return path


def is_local_model_path(path: str) -> bool:
    """True when `path` can only name a local folder: a fixture, an absolute, home or dotted
    path, or one with more than one `/` (a hub id is `org/name`). A bare `org/name` that is not a
    folder here is a hub id, fetched (or found in the cache) by `pdcheck.serving.weights`."""
    if path.startswith(FIXTURE_PREFIX):
        return True
    return (
        path.startswith(("/", "~", "./", "../"))
        or path in (".", "..")
        or path.count("/") > 1
        or Path(path).exists()
    )


def check_model_paths(models: Iterable[ModelSpec]) -> None:
    """Refuse (exit 3) a model whose local folder does not exist, before any server starts: vLLM
    would take the path for a hub id and crash with HFValidationError minutes later."""
    for model in models:
        if not is_local_model_path(model.path):
            continue
        folder = Path(resolve_model_path(model.path)).expanduser()
        if folder.is_dir():
            continue
        hint = (
            "build it with `pdcheck fixtures tiny-models`"
            if model.path.startswith(FIXTURE_PREFIX)
            else "give an existing model folder, or a hub id `org/name`"
        )
        raise ConfigError(
            f"model {model.name!r}: its path {model.path!r} is not a folder ({folder} "
            f"{'is not a folder' if folder.exists() else 'does not exist'}); {hint}"
        )


def environment_venv_dir(pip_spec: str) -> Path:
    """The cached venv an environment's pip requirement is built into: one per requirement text,
    under pdcheck's cache, named so that a person can tell which is which."""
    slug = re.sub(r"[^A-Za-z0-9.]+", "-", pip_spec).strip("-")[:60]
    digest = hashlib.sha256(pip_spec.encode()).hexdigest()[:12]
    return cache_dir() / "venvs" / f"{slug}-{digest}"


def environment_python(env: EnvironmentSpec) -> str | None:
    """The interpreter of an environment: the one given, or its cached venv's; None for an
    environment given as a `vllm` executable."""
    if env.python is not None:
        return env.python
    if env.pip_spec is not None:
        return str(environment_venv_dir(env.pip_spec) / "bin" / "python")
    return None


def write_text_atomic(path: Path, text: str) -> None:
    """Write to a temporary file beside `path`, fsync, then rename over it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
