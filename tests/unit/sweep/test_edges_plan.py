"""The block size a cell's boundary prompts aim at, and the dry run's line for cells without a plan."""

from __future__ import annotations

import sys

import pytest

from pdcheck.config import expand_cells, parse_sweep
from pdcheck.errors import ConfigError
from pdcheck.sweep.edges import block_size, coverage_line


def _cell(serve_args: list[str], *, platform: str = "cpu", edges: bool = True):
    spec = parse_sweep(
        {
            "name": "t",
            "models": [{"name": "m", "path": "/nonexistent/model", "serve_args": serve_args}],
            "eval": {"edges": edges},
            "serving": {"platform": platform},
        }
    )
    return expand_cells(spec)[0]


def test_block_size_is_the_serve_args_else_the_platform_default():
    assert block_size(_cell(["--block-size", "32"])) == 32
    assert block_size(_cell(["--block-size=64"], platform="gpu")) == 64
    assert block_size(_cell([])) == 128
    assert block_size(_cell([], platform="gpu")) == 16


def test_a_block_size_that_is_not_a_number_is_refused():
    with pytest.raises(ConfigError, match="--block-size 'big' is not a whole number"):
        block_size(_cell(["--block-size", "big"]))


def test_the_dry_run_says_why_a_cell_has_no_plan(monkeypatch):
    """A cell left unplanned (its tokenizer is not on the machine: here, transformers is not
    installed) and one with edges off."""
    monkeypatch.setitem(sys.modules, "transformers", None)
    assert "tokenizer is not on this machine: transformers is not installed" in coverage_line(
        _cell([])
    )
    assert coverage_line(_cell([], edges=False)).endswith("off (eval.edges is false)")


def test_a_cells_shard_does_not_depend_on_its_boundary_plan():
    """Two shard machines, one with the model's tokenizer (the cell planned, its id changed) and
    one without: each cell still falls in the same shard on both, so none runs twice or never."""
    from pdcheck.config.schema import EdgePlan, EdgePrompt
    from pdcheck.sweep.run import shard_cells

    spec = parse_sweep(
        {
            "name": "t",
            "models": [{"name": f"m{i}", "path": f"/nonexistent/m{i}"} for i in range(8)],
            "eval": {"edges": True},
        }
    )
    bare = expand_cells(spec)
    plan = EdgePlan(block_size=16, prompts=(EdgePrompt(index=0, shots=(), tokens=16),))
    planned = [
        c.model_copy(update={"eval": c.eval.model_copy(update={"edge_plan": plan})}) for c in bare
    ]
    assert all(p.id != b.id for p, b in zip(planned, bare, strict=True))
    for i in (1, 2, 3):
        names = [c.name for c in shard_cells(bare, (i, 3))]
        assert [c.name for c in shard_cells(planned, (i, 3))] == names
