"""Where pdcheck finds its shipped data (sweeps, fixtures) and keeps things outside it (the model
and vLLM-fixes caches), and how a file there or in a run folder is written whole."""

from __future__ import annotations

import importlib.resources
import os
import tempfile
from pathlib import Path

from pdcheck.contracts import environment

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
