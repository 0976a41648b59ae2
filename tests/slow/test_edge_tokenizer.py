"""The tokenizer boundary prompts are planned with: the model's own, or none with the reason."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from pdcheck.config import EvalSettings
from pdcheck.evals.edges import TokenizerMissing, token_counter

QWEN3_CONFIG = Path(__file__).parents[1] / "contract" / "hub" / "Qwen--Qwen3-0.6B" / "config.json"


def test_a_model_folder_with_only_its_config_gives_no_tokenizer(tmp_path):
    """A config without tokenizer files (the contract tier's hub stand-ins, a half-downloaded
    cache) loads in transformers as a tokenizer with no vocabulary; counting every prompt as 0
    tokens would send the planner after targets it can never reach, so it is refused."""
    shutil.copy(QWEN3_CONFIG, tmp_path / "config.json")
    with pytest.raises(TokenizerMissing, match="no vocabulary"):
        token_counter(str(tmp_path), EvalSettings())
    assert token_counter("fixture:tiny-llama", EvalSettings())("The answer is 42.") > 0


def test_only_takes_the_id_a_results_folder_names(tmp_path):
    """A cell's id names its planned boundary prompts (a results folder's `name--id`, a report
    row), and `--only ID` selects the cell by that id, not by the id before planning."""
    from pdcheck.config import expand_cells, load_sweep
    from pdcheck.sweep.run import SweepRequest, prepare

    name = "tiny-llama-p1x1-d1x1-sync-fixes-on"
    unplanned = next(c for c in expand_cells(load_sweep("cpu-smoke")) if c.name == name)
    planned = next(
        c
        for c in prepare(SweepRequest(file="cpu-smoke", out=tmp_path / "a")).cells
        if c.name == name
    )
    assert planned.eval.edge_plan is not None and planned.id != unplanned.id
    (chosen,) = prepare(
        SweepRequest(file="cpu-smoke", out=tmp_path / "b", only=(planned.id,))
    ).cells
    assert chosen.id == planned.id
