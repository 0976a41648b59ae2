"""Where a job's servers come from: started by pdcheck (serving) or given by the user (attach).

A backend turns a cell into running `Endpoints` for the engine. `ServingBackend` starts real
vLLM topologies through `pdcheck.serving` and says in `Endpoints.started` exactly what ran;
`AttachBackend` hands back the endpoints the user already runs (checked by
`pdcheck.serving.attach`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, Protocol

from pdcheck.config import Cell
from pdcheck.config.schema import RayPlacement, RaySettings
from pdcheck.errors import ConfigError
from pdcheck.results.store import Provenance
from pdcheck.serving.endpoints import Endpoints


class Backend(Protocol):
    @property
    def gpu_indices(self) -> tuple[int, ...]:
        """The GPUs jobs may be placed on (empty on CPU)."""
        ...

    def provenance(self, cell: Cell) -> Provenance:
        """The vLLM build the cell's servers run (joins the baseline key and every stamp)."""
        ...

    def baseline(
        self, cell: Cell, *, gpus: tuple[int, ...], cell_dir: Path
    ) -> contextlib.AbstractContextManager[Endpoints]:
        """Start the no-PD baseline on `gpus`; yields its endpoints; stops it on exit."""
        ...

    def pd(
        self, cell: Cell, *, gpus: tuple[int, ...], cell_dir: Path, prefill_key: str | None = None
    ) -> contextlib.AbstractContextManager[Endpoints]:
        """Start prefill(s) + decode(s) + proxy on `gpus`; yields the endpoints; stops them on exit.

        Jobs with the same `prefill_key` may share prefill servers, kept up until `close()`.
        """
        ...

    def close(self) -> None:
        """Stop whatever was kept up between jobs; the engine calls it when its jobs end."""
        ...


@dataclass(frozen=True)
class AttachBackend:
    """The user's own servers: every job of the (single) cell uses the same endpoints; nothing starts."""

    endpoints: Endpoints
    vllm_version: str | None = None

    @property
    def gpu_indices(self) -> tuple[int, ...]:
        return ()

    def provenance(self, cell: Cell) -> Provenance:
        return Provenance(vllm_version=self.vllm_version)

    @contextlib.contextmanager
    def baseline(self, cell: Cell, *, gpus: tuple[int, ...], cell_dir: Path) -> Iterator[Endpoints]:
        yield self.endpoints

    @contextlib.contextmanager
    def pd(
        self, cell: Cell, *, gpus: tuple[int, ...], cell_dir: Path, prefill_key: str | None = None
    ) -> Iterator[Endpoints]:
        yield self.endpoints

    def close(self) -> None:
        pass


@dataclass(frozen=True)
class BackendChoice:
    """`--backend`, `--ray-address` and `--ray-placement` as given (None: not given)."""

    kind: Literal["local", "ray"] | None = None
    ray_address: str | None = None
    ray_placement: RayPlacement | None = None


def ray_settings(file: RaySettings | None, choice: BackendChoice) -> RaySettings | None:
    """The Ray settings a run uses (None: the local backend): the sweep file's `ray` section,
    selected by `--backend ray` too, with the options over the file's values."""
    ray_options = choice.ray_address is not None or choice.ray_placement is not None
    if choice.kind == "local" and ray_options:
        raise ConfigError("--ray-address and --ray-placement are for --backend ray, not local")
    if choice.kind == "local" or (choice.kind is None and file is None and not ray_options):
        return None
    settings = file or RaySettings()
    updates = {"address": choice.ray_address, "placement": choice.ray_placement}
    return settings.model_copy(update={k: v for k, v in updates.items() if v is not None})
