"""Where a job's servers come from: started by pdcheck (serving) or given by the user (attach).

A backend turns a cell into running endpoints for the engine. `ServingBackend` starts real
vLLM topologies through `pdcheck.serving`; `AttachBackend` hands back URLs the user already
runs (`--baseline-url/--pd-url/--decoder-metrics-url`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from pdcheck.config import Cell
from pdcheck.sweep.store import Provenance


@dataclass(frozen=True)
class PdEndpoints:
    """A running PD topology: the proxy URL, decoders' metrics URLs, and the plugin's folder."""

    url: str
    decoder_metrics_urls: tuple[str, ...] = ()
    # The decoders' plugin folders, where injections.jsonl is written.
    plugin_dirs: tuple[Path, ...] = ()
    # Raises ServerCrashed when a server pdcheck started has died (a no-op in attach mode).
    check_alive: Callable[[], None] = field(default=lambda: None, compare=False)


class Backend(Protocol):
    gpu_indices: tuple[int, ...]

    def provenance(self, cell: Cell) -> Provenance:
        """The vLLM build the cell's servers run (joins the baseline key and every stamp)."""

    def describe(self, cell: Cell, *, cell_dir: Path) -> dict[str, Any]:
        """Every server's argv and env, for cell.json and --dry-run."""

    def baseline(
        self, cell: Cell, *, gpus: tuple[int, ...], cell_dir: Path
    ) -> contextlib.AbstractContextManager[str]:
        """Start the no-PD baseline; yields its URL; stops it on exit."""

    def pd(
        self, cell: Cell, *, gpus: tuple[int, ...], cell_dir: Path, prefill_key: str | None = None
    ) -> contextlib.AbstractContextManager[PdEndpoints]:
        """Start prefill(s) + decode(s) + proxy; yields the endpoints; stops them on exit.

        Jobs with the same `prefill_key` may share prefill servers, kept up until `close()`.
        """

    def close(self) -> None:
        """Stop whatever was kept up between jobs; the engine calls it when its jobs end."""


@dataclass
class AttachBackend:
    """The user's own servers: every job of the (single) cell uses the same URLs; nothing starts."""

    baseline_url: str
    pd_url: str
    decoder_metrics_urls: tuple[str, ...] = ()
    plugin_dirs: tuple[Path, ...] = ()
    vllm_version: str | None = None
    gpu_indices: tuple[int, ...] = ()

    def provenance(self, cell: Cell) -> Provenance:
        return Provenance(vllm_version=self.vllm_version)

    def describe(self, cell: Cell, *, cell_dir: Path) -> dict[str, Any]:
        return {
            "attached": {
                "baseline_url": self.baseline_url,
                "pd_url": self.pd_url,
                "decoder_metrics_urls": list(self.decoder_metrics_urls),
            }
        }

    @contextlib.contextmanager
    def baseline(self, cell: Cell, *, gpus: tuple[int, ...], cell_dir: Path) -> Iterator[str]:
        yield self.baseline_url

    @contextlib.contextmanager
    def pd(
        self, cell: Cell, *, gpus: tuple[int, ...], cell_dir: Path, prefill_key: str | None = None
    ) -> Iterator[PdEndpoints]:
        yield PdEndpoints(self.pd_url, self.decoder_metrics_urls, self.plugin_dirs)

    def close(self) -> None:
        pass
