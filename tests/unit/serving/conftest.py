"""Cells for serving unit tests, built through the real sweep schema."""

from __future__ import annotations

from typing import Any

import pytest

from pdcheck.config import Cell, expand_cells
from pdcheck.config.schema import SweepSpec


def make_cell(*, model: dict[str, Any] | None = None, **sections: Any) -> Cell:
    """The first cell of a one-model sweep; `sections` are top-level sweep keys (matrix, serving, ...)."""
    spec = {
        "name": "unit",
        "models": [{"name": "m", "path": "/models/m", **(model or {})}],
        **sections,
    }
    return expand_cells(SweepSpec.model_validate(spec))[0]


def gpu_cell(prefill_tp: int, decode_tp: int, **matrix: Any) -> Cell:
    """A GPU cell of the one-model sweep at these TPs; `matrix` adds other matrix keys."""
    return make_cell(
        matrix={"prefill_tp": [prefill_tp], "decode_tp": [decode_tp], **matrix},
        serving={"platform": "gpu"},
    )


@pytest.fixture
def cell_factory():
    return make_cell
