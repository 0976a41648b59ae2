"""Whole bisects on synthetic git histories: `git bisect run` drives one predicate process per step.

The histories, the predicate and the config come from tests/unit/bisect, which keeps the checks
that start no bisect (policies, the plan, refused inputs).
"""

from __future__ import annotations

import json
import shutil

from pdcheck.bisect import run_bisect
from tests.unit.bisect.test_bisect import _git, config, make_history


def test_names_exactly_the_first_bad_commit(tmp_path):
    """With a deterministic predicate, bisect names the commit that introduced the failure."""
    repo, shas = make_history(tmp_path)
    result = run_bisect(config(repo, tmp_path, shas[0], shas[-1]))
    assert result.first_bad is not None and result.first_bad.sha == shas[13]
    assert result.first_bad.subject == "change 13 (introduces the bug)"
    out = tmp_path / "out"
    assert f"# first bad commit: [{shas[13]}]" in (out / "bisect.log").read_text()
    assert "change 13" in (out / "bisect.md").read_text()
    assert json.loads((out / "bisect.json").read_text())["first_bad"]["sha"] == shas[13]
    assert not (out / "worktree").exists(), "the private worktree must be removed"
    assert _git(repo, "rev-parse", "HEAD") == shas[-1], "the user's checkout must not move"


def test_infra_failures_are_skipped_never_bad(tmp_path):
    """A commit whose run hits an infra error (exit 2) is skipped; the culprit is still found."""
    repo, shas = make_history(tmp_path, broken=(9, 10))
    result = run_bisect(config(repo, tmp_path, shas[0], shas[-1]))
    assert result.first_bad is not None and result.first_bad.sha == shas[13]
    outcomes = {s["sha"]: s["outcome"] for s in result.steps}
    assert all(outcomes[s] == "skip" for s in (shas[9], shas[10]) if s in outcomes)
    assert all(o != "bad" for s, o in outcomes.items() if s in shas[:13])


def test_cache_is_reused_on_a_second_bisect(tmp_path):
    """Results are cached per commit sha: a second bisect over the same range runs nothing new."""
    repo, shas = make_history(tmp_path)
    first = run_bisect(config(repo, tmp_path, shas[0], shas[-1]))
    shutil.rmtree(tmp_path / "out")
    second = run_bisect(config(repo, tmp_path, shas[0], shas[-1]))
    assert second.first_bad == first.first_bad
    assert second.steps and all(s["cached"] for s in second.steps)
