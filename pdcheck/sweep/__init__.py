"""Sweep: orchestration of cells and units, and the results store."""

from pdcheck.sweep.store import Provenance, RunResults, RunStore, load_run

__all__ = ["Provenance", "RunResults", "RunStore", "load_run"]
