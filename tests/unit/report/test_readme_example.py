"""The README's example report is what `scripts/readme_example.py` renders from a stored real run."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from tests.unit.scripts import load_script

from .conftest import CellPlan

REPO = Path(__file__).resolve().parents[3]


readme_example = load_script("readme_example")


def test_the_readme_block_is_what_the_script_renders_from_the_stored_run():
    """Hand edits, or a report whose table changed since, fail here: run the script again."""
    run_dir = readme_example.stored_run()
    block = readme_example.readme_block((REPO / "README.md").read_text())
    assert block == readme_example.render_block(run_dir), (
        "README.md's example is stale: run `python scripts/readme_example.py` "
        "(or give it a new results folder)"
    )
    sha = hashlib.sha256((run_dir / "summary.json").read_bytes()).hexdigest()
    assert block.splitlines()[0].startswith(
        f"<!-- readme-example: begin run {run_dir.name}, summary.json sha256 {sha};"
    )
    assert "| Config | c |" in block and "**Overall:" in block


def test_the_stored_run_has_the_cells_of_todays_cpu_smoke():
    """The example run is the sweep `make sweep` runs today: a cell added to or taken from
    `cpu-smoke` (a model, an arm, a topology) fails here until the run is made again."""
    from pdcheck.config import expand_cells, load_sweep

    run_dir = readme_example.stored_run()
    stored = sorted(d.name.rsplit("--", 1)[0] for d in (run_dir / "cells").iterdir())
    today = sorted(cell.name for cell in expand_cells(load_sweep("cpu-smoke")))
    assert stored == today, (
        "docs/example-run is not today's cpu-smoke: `make sweep`, then "
        "`python scripts/readme_example.py pdcheck-results/cpu-smoke-...`"
    )


def test_the_stored_copy_renders_as_the_results_folder_does(make_run, tmp_path):
    """The copy leaves out records, logs and plugin markers, and still renders the same block."""
    run_dir = make_run([CellPlan("fixes-on"), CellPlan("inject-zero", drops={1: 5, 8: 60})])
    plugin = next((run_dir / "cells").iterdir()) / "plugin" / "decode-0"
    plugin.mkdir(parents=True)
    (plugin / "activation.json").write_text("{}")
    stored = readme_example.store_run(run_dir, tmp_path / "stored")
    assert stored == tmp_path / "stored" / run_dir.name
    kept = {p.relative_to(stored) for p in stored.rglob("*") if p.is_file()}
    assert kept and all(p.suffix == ".json" for p in kept)
    assert not any({"logs", "plugin"} & set(p.parts) for p in kept)
    assert readme_example.render_block(stored) == readme_example.render_block(run_dir)


@pytest.mark.parametrize(
    "text",
    [
        "no block",
        "<!-- readme-example: begin -->\nx\n",
        "<!-- readme-example: begin -->\n<!-- readme-example: end -->\n" * 2,
    ],
)
def test_a_readme_without_exactly_one_block_is_refused(text):
    """The script writes between its markers only, so it must find exactly one pair."""
    with pytest.raises(SystemExit, match="must hold one"):
        readme_example.readme_block(text)
