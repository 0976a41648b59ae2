"""Results: a run folder's files, their schema, its one writer and its reader, and its summary.

Below `report`, which renders a folder, and `sweep`, which fills one: neither reaches into the
other for the data they share.
"""

from pdcheck.results.load import CellResult, RunResults, UnitResult, check_run, load_run
from pdcheck.results.schema import Provenance
from pdcheck.results.store import RunStore, create_run, open_run

__all__ = [
    "CellResult",
    "Provenance",
    "RunResults",
    "RunStore",
    "UnitResult",
    "check_run",
    "create_run",
    "load_run",
    "open_run",
]
