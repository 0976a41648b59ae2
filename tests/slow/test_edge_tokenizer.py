"""The tokenizer boundary prompts are planned with: the model's own, or none with the reason."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from pdcheck.config import EvalSettings
from pdcheck.config.paths import resolve_model_path
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


class _TokenizerHub:
    """snapshot_download over a local cache: a fetch copies the tiny Llama's files that match
    the patterns asked for; `local_files_only` finds only what was fetched (as the Hub's cache)."""

    def __init__(self, root: Path):
        self.root, self.fetched = root, []

    def snapshot_download(self, repo_id, *, allow_patterns, local_files_only, **kwargs):
        import fnmatch

        from huggingface_hub.errors import LocalEntryNotFoundError

        folder = self.root / repo_id.replace("/", "--")
        if not local_files_only:
            self.fetched.append({"repo_id": repo_id, "allow_patterns": allow_patterns, **kwargs})
            folder.mkdir(parents=True, exist_ok=True)
            source = Path(resolve_model_path("fixture:tiny-llama"))
            for f in source.iterdir():
                if any(fnmatch.fnmatch(f.name, p) for p in allow_patterns):
                    shutil.copy(f, folder / f.name)
        if not folder.is_dir():
            raise LocalEntryNotFoundError(f"{repo_id} is not in the cache")
        return str(folder)


def _hub_cell(repo_id: str):
    from pdcheck.config import expand_cells, parse_sweep

    spec = parse_sweep(
        {
            "name": "t",
            "models": [
                {"name": "m", "path": repo_id, "serve_args": ["--revision", "v1"]},
            ],
            "eval": {"task": "gsm8k-synth", "limit": 20, "edges": True},
            "serving": {"platform": "cpu"},
        }
    )
    return expand_cells(spec)[0]


def test_a_real_run_fetches_a_hub_models_tokenizer_files_and_plans_as_later_runs(
    tmp_path, monkeypatch
):
    """On a machine whose cache lacks a hub model, a real run fetches its tokenizer files (no
    weights, at the servers' --revision) before planning, so its first run has the boundary
    prompts, and the cell id, of every later run; a dry run fetches nothing and says why."""
    import huggingface_hub

    from pdcheck.serving.weights import TOKENIZER_PATTERNS
    from pdcheck.sweep.edges import coverage_line, plan_cells

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    hub = _TokenizerHub(tmp_path / "cache")
    monkeypatch.setattr(huggingface_hub, "snapshot_download", hub.snapshot_download)

    (cold,) = plan_cells([_hub_cell("org/cold")])
    assert cold.eval.edge_plan is None and hub.fetched == []
    assert "a real run fetches its tokenizer files first" in coverage_line(cold)

    (first,) = plan_cells([_hub_cell("org/fresh")], fetch_tokenizers=True)
    assert first.eval.edge_plan is not None and first.eval.edge_plan.prompts
    (fetch,) = hub.fetched
    assert fetch["repo_id"] == "org/fresh" and fetch["revision"] == "v1"
    assert tuple(fetch["allow_patterns"]) == TOKENIZER_PATTERNS
    assert not list((tmp_path / "cache").rglob("*.safetensors"))
    (later,) = plan_cells([_hub_cell("org/fresh")])
    assert later.id == first.id
