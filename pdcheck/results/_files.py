"""Files of a run folder: typed reads and atomic writes of the schema's structs, failure bodies, paths."""

from __future__ import annotations

import json
import traceback
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

import msgspec

from pdcheck.config.cells import Side
from pdcheck.config.paths import write_text_atomic
from pdcheck.errors import ResultsFileError
from pdcheck.results.schema import (
    SUPPORTED_SCHEMA_VERSIONS,
    FailureFile,
    Provenance,
    Stamped,
    from_json,
    stamp,
    to_json,
)

StampedT = TypeVar("StampedT", bound=Stamped)


def now_iso() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


def write_file(path: Path, data: Stamped) -> None:
    """Write one of the schema's files atomically, as indented JSON with sorted keys."""
    write_text_atomic(path, to_json(data) + "\n")


# What an older schema version wrote, brought to the current shape: (version, data) -> data.
Upgrade = Callable[[int, dict[str, Any]], dict[str, Any]]


def read_file(
    path: Path, kind: type[StampedT], *, upgrade: Upgrade | None = None
) -> StampedT | None:
    """Read `path` as `kind`, or None if it does not exist.

    Raises ResultsFileError, naming the file, when it cannot be read, is not JSON, was written by
    an unsupported schema version, or does not match `kind`.
    """
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_bytes())
    except OSError as exc:
        raise ResultsFileError(f"cannot be read ({exc.strerror})", path=path) from None
    except (ValueError, RecursionError) as exc:
        raise ResultsFileError(f"is not valid JSON ({exc})", path=path) from None
    if not isinstance(data, dict):
        raise ResultsFileError(
            f"holds a JSON {type(data).__name__}; a {kind.__name__} is a JSON object", path=path
        )
    version = data.get("schema_version")
    if version not in SUPPORTED_SCHEMA_VERSIONS:
        supported = ", ".join(map(str, SUPPORTED_SCHEMA_VERSIONS))
        raise ResultsFileError(
            f"has schema_version {version!r}; this pdcheck reads versions {supported} "
            "(a folder written by a newer pdcheck needs that pdcheck)",
            path=path,
        )
    if upgrade is not None:
        data = upgrade(version, data)
    try:
        return from_json(data, kind)
    except msgspec.ValidationError as exc:
        raise ResultsFileError(
            f"does not hold a valid {kind.__name__} (schema_version {version}): {exc}",
            path=path,
        ) from None


def trim_torn_tail(path: Path) -> None:
    """Truncate `path` after its last newline, if it ends in a partial line."""
    if not path.is_file():
        return
    data = path.read_bytes()
    if not data or data.endswith(b"\n"):
        return
    with open(path, "r+b") as f:
        f.truncate(data.rfind(b"\n") + 1)


def failure_file(
    exc: BaseException, *, cell: str | None, where: str, provenance: Provenance
) -> FailureFile:
    """The body of a failure.json sidecar: error type, message, cell, and where it happened."""
    return FailureFile(
        **stamp(provenance),
        error_type=type(exc).__name__,
        message=str(exc),
        cell=cell,
        where=where,
        at=now_iso(),
        traceback="".join(traceback.format_exception(exc))[-4000:],
    )


def unit_rel(side: Side, concurrency: int, repeat: int) -> str:
    return f"{side}/c{concurrency}/r{repeat}"
