"""Where pdcheck keeps things outside the repo: the tiny-model cache and result folders."""

from __future__ import annotations

import os
from pathlib import Path

FIXTURE_PREFIX = "fixture:"


def cache_dir() -> Path:
    """$PDCHECK_CACHE_DIR, else $XDG_CACHE_HOME/pdcheck, else ~/.cache/pdcheck."""
    if env := os.environ.get("PDCHECK_CACHE_DIR"):
        return Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "pdcheck"


def fixture_models_dir() -> Path:
    return cache_dir() / "models"


def resolve_model_path(path: str) -> str:
    """`fixture:<name>` → the built tiny model's directory; anything else is returned unchanged."""
    if path.startswith(FIXTURE_PREFIX):
        return str(fixture_models_dir() / path[len(FIXTURE_PREFIX):])
    return path
