"""The engine on simulated GPUs: jobs of a wave run at once on disjoint GPU sets, never more than exist."""

from __future__ import annotations

import contextlib
import threading
import time

from pdcheck.config import expand_cells, load_sweep
from pdcheck.results.schema import SweepInfo
from pdcheck.results.store import Provenance, create_run, load_run
from pdcheck.serving import Endpoints
from pdcheck.sweep.engine import Engine


class RecordingGpuBackend:
    """Fake servers on a simulated 4-GPU node; records which GPUs each job held and when."""

    def __init__(self, baseline_url, pd_url, gpus=(0, 1, 2, 3)):
        self.baseline_url, self.pd_url = baseline_url, pd_url
        self.gpu_indices = tuple(gpus)
        self.held: list[tuple[str, tuple[int, ...], float, float]] = []
        self._lock = threading.Lock()

    def provenance(self, cell):
        return Provenance(vllm_version="sim")

    @contextlib.contextmanager
    def _hold(self, label, gpus):
        start = time.monotonic()
        try:
            yield
        finally:
            with self._lock:
                self.held.append((label, gpus, start, time.monotonic()))

    @contextlib.contextmanager
    def baseline(self, cell, *, gpus, cell_dir):
        with self._hold(f"baseline {cell.name}", gpus):
            yield Endpoints(baseline_url=self.baseline_url)

    @contextlib.contextmanager
    def pd(self, cell, *, gpus, cell_dir, prefill_key=None):
        with self._hold(f"pd {cell.name}", gpus):
            yield Endpoints(pd_url=self.pd_url)

    def close(self):
        pass


def test_wave_jobs_overlap_only_on_disjoint_gpus(sweep_file, servers, tmp_path):
    """Concurrent jobs hold disjoint GPU sets of the right size; the sweep still judges every cell."""
    base, good, _bad = servers
    backend = RecordingGpuBackend(base.url, good.url)
    cells = expand_cells(load_sweep(sweep_file))
    store = create_run(
        tmp_path / "r",
        provenance=Provenance(),
        sweep=SweepInfo(name="fake", file="fake.yaml", sha256="x"),
        environment={},
    )
    result = Engine(cells, store=store, backend=backend).run()
    assert result.server_starts == 3  # one shared baseline, one PD per arm
    for label, gpus, *_ in backend.held:
        assert len(gpus) == (1 if label.startswith("baseline") else 2) and set(gpus) <= {0, 1, 2, 3}
    overlapping = [
        (a, b)
        for i, a in enumerate(backend.held)
        for b in backend.held[i + 1 :]
        if a[2] < b[3] and b[2] < a[3]
    ]
    assert overlapping, "with 4 GPUs the baseline (1) and a PD topology (2) must run at once"
    for a, b in overlapping:
        assert set(a[1]).isdisjoint(b[1]), f"{a[0]} and {b[0]} shared a GPU"
    assert all(len(c.verdicts) == 2 for c in load_run(store.root).cells)


def test_progress_events_count_each_verdict_once_and_reach_all_cells(sweep_file, servers, tmp_path):
    """The live display's numbers: one verdict per cell and level, cells done reaches the total, questions add up."""
    base, good, _ = servers
    events = []
    cells = expand_cells(load_sweep(sweep_file))
    store = create_run(
        tmp_path / "r",
        provenance=Provenance(),
        sweep=SweepInfo(name="fake", file="fake.yaml", sha256="x"),
        environment={},
    )
    Engine(
        cells,
        store=store,
        backend=RecordingGpuBackend(base.url, good.url, gpus=()),
        on_event=events.append,
    ).run()
    last = events[-1]
    assert last.kind == "finished"
    assert sum(last.verdicts.values()) == len(cells) * 2
    assert last.cells_done == last.cells_total == len(cells)
    assert (
        last.questions_done == last.questions_total == 16 * 2 * (1 + len(cells))
    )  # shared baseline runs once
    done_over_time = [e.cells_done for e in events]
    assert (
        done_over_time == sorted(done_over_time) and 0 < done_over_time.index(1) < len(events) - 1
    )
