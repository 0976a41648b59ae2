"""The test items behind `pytest --pdcheck-sweep FILE`: one item per sweep cell.

Each item runs its cell's units with the sweep engine into one shared results folder (the
same format as `pdcheck sweep`), holding a GPU lease for the time its servers are up, so
xdist workers never share a GPU (or, on CPU, never run two topologies at once). The
controller finishes the folder at session end (junit.xml, report.md, summary.json).
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
from filelock import FileLock

from pdcheck.analysis.verdict import Status
from pdcheck.config import Cell, expand_cells, load_sweep, select_cells
from pdcheck.pytest_plugin.attach import attached_endpoints
from pdcheck.results.schema import Selection, SweepInfo
from pdcheck.results.store import RunStore, create_run, load_cell, open_run
from pdcheck.results.summary import cell_outcomes
from pdcheck.sweep.backends import AttachBackend
from pdcheck.sweep.engine import Engine, SweepOptions
from pdcheck.sweep.finish import finish_run
from pdcheck.sweep.judging import clean_tests
from pdcheck.sweep.leases import GpuLeases


class CellFailed(Exception):
    """The cell's verdict is a failure (or infra error); the message is the verdict reasons."""


class SweepFile(pytest.File):
    def collect(self):
        spec = load_sweep(self.path)
        only = tuple(self.config.getoption("pdcheck_only") or ())
        cells = select_cells(expand_cells(spec), only=only)
        # Holm's family is the session's clean tests, so a cell judged alone (at alpha / F)
        # gets the call the session's finish will keep.
        family = clean_tests(cells)
        for cell in cells:
            yield CellItem.from_parent(self, name=cell.name, cell=cell, family_size=family)


class CellItem(pytest.Item):
    def __init__(self, *, cell: Cell, family_size: int = 1, **kwargs):
        super().__init__(**kwargs)
        self.cell = cell
        self.options = SweepOptions(family_size=family_size)
        self.add_marker(pytest.mark.pdcheck_cell)

    def runtest(self) -> None:
        store = open_store(self.config)
        attached = attached_endpoints(self.config)
        if attached is not None:
            Engine(
                [self.cell], store=store, backend=AttachBackend(attached), options=self.options
            ).execute()
        else:
            self._run_on_leased_devices(store)
        outcomes = cell_outcomes(load_cell(store.root / "cells" / self.cell.dirname))
        bad = [
            f"c{c}: {o.verdict} ({o.status}): {o.reason}"
            for c, o in outcomes
            if o.status in (Status.FAIL, Status.INFRA)
        ]
        for c, o in outcomes:
            self.user_properties.append((f"c{c}", f"{o.verdict}: {o.reason}"))
        if bad:
            raise CellFailed("\n".join(bad))

    def _run_on_leased_devices(self, store: RunStore) -> None:
        from pdcheck.serving.gpus import GpuInventory
        from pdcheck.sweep.serving_backend import ServingBackend

        backend = ServingBackend.for_cells([self.cell])
        leases = GpuLeases(store.root / ".gpu-leases.json", backend.gpu_indices)
        with leases.lease(self.cell.gpus_needed, holder=self.nodeid) as gpus:
            if gpus:
                mine = tuple(g for g in backend.inventory.gpus if g.index in gpus)
                backend.inventory = GpuInventory(mine, backend.inventory.source)
            Engine([self.cell], store=store, backend=backend, options=self.options).execute()

    def repr_failure(self, excinfo, style=None):
        if isinstance(excinfo.value, CellFailed):
            return f"{self.cell.name}:\n{excinfo.value}"
        return super().repr_failure(excinfo, style=style)

    def reportinfo(self):
        return self.path, None, f"pdcheck cell {self.cell.name} ({self.cell.id})"


def results_dir(config) -> Path:
    out = config.getoption("pdcheck_out")
    if out:
        return Path(out)
    spec = load_sweep(config.getoption("pdcheck_sweep"))
    return Path("pdcheck-results") / f"{spec.name}-pytest"


def open_store(config) -> RunStore:
    """The shared run folder: created by the first worker that gets here, opened by the others."""
    root = results_dir(config)
    root.mkdir(parents=True, exist_ok=True)
    with FileLock(str(root / ".run.lock")):
        store = open_run(root)
        if store is not None:
            return store
        from pdcheck.sweep.run import run_environment

        attached = config.getoption("pdcheck_baseline_url") is not None
        environment, provenance = run_environment(attached=attached)
        path = Path(config.getoption("pdcheck_sweep"))
        spec = load_sweep(path)
        return create_run(
            root,
            provenance=provenance,
            environment=environment,
            sweep=SweepInfo(
                name=spec.name,
                file=str(path),
                sha256=hashlib.sha256(path.read_bytes()).hexdigest(),
                selection=Selection(
                    only=tuple(config.getoption("pdcheck_only") or ()), runner="pytest"
                ),
            ),
        )


def finish_session(config) -> int | None:
    """On the controller (or a run without xdist): junit.xml, report.md and summary.json.

    Returns the run's exit code (`pdcheck sweep`'s), None on a worker or with no run folder.
    """
    if hasattr(config, "workerinput"):
        return None
    store = open_run(results_dir(config))
    if store is None:
        return None
    summary = finish_run(store).summary
    return None if summary is None else summary.exit_code
