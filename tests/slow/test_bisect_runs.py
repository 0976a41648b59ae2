"""Whole bisects on synthetic git histories: `git bisect run` drives one predicate process per step.

The histories, the predicate and the config come from tests/unit/bisect, which keeps the checks
that start no bisect (policies, the plan, refused inputs).
"""

from __future__ import annotations

import json
import re
import shlex
import shutil
import sys

from click.testing import CliRunner

from pdcheck.bisect import run_bisect
from pdcheck.cli import cli, main
from tests.unit.bisect.test_bisect import PREDICATE, _git, config, make_history


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


def _documented_exit_codes() -> dict[int, str]:
    """The exit codes `pdcheck --help` lists, each with its text (continuation lines joined)."""
    text = CliRunner().invoke(cli, ["--help"]).output.split("Exit codes", 1)[1]
    docs: dict[int, str] = {}
    for line in text.splitlines()[1:]:
        if m := re.match(r"\s+(\d+)\s{2}(.*)", line):
            code = int(m[1])
            docs[code] = m[2]
        elif docs and line.startswith(" " * 5):
            docs[code] += " " + line.strip()
        else:
            break
    return docs


def _pdcheck_bisect(root, **history) -> int:
    repo, shas = make_history(root, **history)
    predicate = shlex.join([sys.executable, "-c", PREDICATE])
    argv = ["bisect", "--vllm-repo", str(repo), "--good", shas[0], "--bad", shas[-1]]
    return main([*argv, "--cmd", predicate, "--install", "none", "--out", str(root / "out")])


def test_pdcheck_bisect_exits_as_its_help_says(tmp_path, monkeypatch):
    """Found the first bad commit: 0; only skipped commits left: 1, as `pdcheck --help` says."""
    monkeypatch.setenv("PDCHECK_CACHE_DIR", str(tmp_path / "cache"))
    found = _pdcheck_bisect(tmp_path / "found")
    only_skipped = _pdcheck_bisect(tmp_path / "skipped", broken=(12,))
    docs = _documented_exit_codes()
    assert "bisect found the first bad commit" in docs[found], docs
    assert "bisect was left with only skipped commits" in docs[only_skipped], docs
    bisect_help = CliRunner().invoke(cli, ["bisect", "--help"]).output
    exits = " ".join(bisect_help.split("Exit: ", 1)[1].split("\n\n", 1)[0].split())
    assert f"{found} the first bad commit was found" in exits
    assert f"{only_skipped} only skipped commits were left" in exits
