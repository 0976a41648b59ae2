"""Files of a run folder: atomic JSON/text writes, stamps (`Provenance`), failure bodies, paths."""

from __future__ import annotations

import json
import os
import tempfile
import traceback
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

from pdcheck import __version__

STORE_SCHEMA_VERSION = 1
SIDES = ("baseline", "pd")
Side = Literal["baseline", "pd"]


def now_iso() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


def write_json_atomic(path: Path, data: dict[str, Any]) -> None:
    write_text_atomic(path, json.dumps(data, indent=2, sort_keys=True, default=str) + "\n")


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


def trim_torn_tail(path: Path) -> None:
    """Truncate `path` after its last newline, if it ends in a partial line."""
    if not path.is_file():
        return
    data = path.read_bytes()
    if not data or data.endswith(b"\n"):
        return
    with open(path, "r+b") as f:
        f.truncate(data.rfind(b"\n") + 1)


def read_json(path: Path) -> dict[str, Any] | None:
    if not path.is_file():
        return None
    with open(path, encoding="utf-8") as f:
        return json.load(f)


@dataclass(frozen=True)
class Provenance:
    """Stamped into every JSON the store writes, so any file says what produced it."""

    pdcheck_version: str = __version__
    vllm_version: str | None = None
    vllm_commit: str | None = None
    dataset_sha256: str | None = None

    def stamp(self) -> dict[str, Any]:
        return {
            "schema_version": STORE_SCHEMA_VERSION,
            "pdcheck_version": self.pdcheck_version,
            "vllm_version": self.vllm_version,
            "vllm_commit": self.vllm_commit,
            "dataset_sha256": self.dataset_sha256,
        }

    @classmethod
    def from_stamp(cls, data: dict[str, Any]) -> Provenance:
        return cls(
            pdcheck_version=data.get("pdcheck_version") or "unknown",
            vllm_version=data.get("vllm_version"),
            vllm_commit=data.get("vllm_commit"),
            dataset_sha256=data.get("dataset_sha256"),
        )


def failure_dict(exc: BaseException, *, cell: str | None, where: str) -> dict[str, Any]:
    """The body of a failure.json sidecar: error type, message, cell, and where it happened."""
    return {
        "error_type": type(exc).__name__,
        "message": str(exc),
        "cell": cell,
        "where": where,
        "at": now_iso(),
        "traceback": "".join(traceback.format_exception(exc))[-4000:],
    }


def unit_rel(side: str, concurrency: int, repeat: int) -> str:
    return f"{side}/c{concurrency}/r{repeat}"
