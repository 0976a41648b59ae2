"""Progress events the engine emits; the CLI (or the pytest plugin) renders them.

The engine never prints: it calls `on_event(event)` with a snapshot of where the sweep is,
so a live display, a log or a test can follow it.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass(frozen=True)
class SweepEvent:
    """What just happened (`kind`, `message`) and the progress snapshot after it."""

    kind: str  # weights, planned, phase, record, unit-done, verdict, failure, race, finished
    message: str
    cells_done: int
    cells_total: int
    current_cell: str | None
    phase: str | None
    questions_done: int
    questions_total: int
    elapsed_s: float
    verdicts: dict[str, int]
    server_starts: int

    @property
    def questions_per_s(self) -> float:
        return self.questions_done / self.elapsed_s if self.elapsed_s > 0 else 0.0

    @property
    def eta_s(self) -> float | None:
        """Remaining questions at the rate so far (server starts included in that rate)."""
        if self.questions_done == 0:
            return None
        return (self.questions_total - self.questions_done) / self.questions_per_s


EventSink = Callable[[SweepEvent], None]


@dataclass
class Progress:
    """Mutable progress the engine updates; `emit` sends a frozen snapshot."""

    on_event: EventSink | None
    cells_total: int = 0
    questions_total: int = 0
    cells_done: int = 0
    questions_done: int = 0
    server_starts: int = 0
    current_cell: str | None = None
    phase: str | None = None
    verdicts: Counter = field(default_factory=Counter)
    started: float = field(default_factory=time.monotonic)

    def emit(self, kind: str, message: str = "") -> None:
        if self.on_event is None:
            return
        self.on_event(
            SweepEvent(
                kind=kind,
                message=message,
                cells_done=self.cells_done,
                cells_total=self.cells_total,
                current_cell=self.current_cell,
                phase=self.phase,
                questions_done=self.questions_done,
                questions_total=self.questions_total,
                elapsed_s=time.monotonic() - self.started,
                verdicts=dict(self.verdicts),
                server_starts=self.server_starts,
            )
        )
