"""The shipped one-GPU sweep end to end on this machine's first GPU: every server of every job
on GPU 0 (a PD job's two servers sharing it with a memory share each, started one after the
other), clean arms PASS and canaries flagged: `pdcheck sweep one-gpu` exits 0. Minutes (sized
for under 10 on one H100, docs/notes/issue-31.md); skipped when no GPU is present."""

from __future__ import annotations

import json

import pytest

from pdcheck.cli import main
from pdcheck.config import expand_cells, load_sweep
from pdcheck.config.paths import fixture_models_dir

pytestmark = [pytest.mark.gpu, pytest.mark.servers, pytest.mark.xdist_group("servers")]


def test_the_one_gpu_sweep_passes_on_gpu_0(tmp_path, monkeypatch):
    for name in ("tiny-llama", "tiny-granite"):
        assert (fixture_models_dir() / name / "config.json").is_file(), (
            "run `pdcheck fixtures tiny-models`"
        )
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    out = tmp_path / "run"
    assert main(["sweep", "one-gpu", "--out", str(out)]) == 0
    # Every cell of the sweep, not whatever cell.json files exist: with none the loop below
    # would check nothing and pass.
    cells = expand_cells(load_sweep("one-gpu"))
    assert cells
    for cell in cells:
        cell_json = out / "cells" / cell.dirname / "cell.json"
        assert cell_json.is_file(), f"{cell.name}: no cell.json in {out}"
        topologies = json.loads(cell_json.read_text())["servers"]
        assert topologies and all(t["servers"] for t in topologies), (
            f"{cell.name}: cell.json records no server"
        )
        for topology in topologies:
            assert {s["env"]["CUDA_VISIBLE_DEVICES"] for s in topology["servers"]} == {"0"}
