"""Drive `git bisect run` in a private worktree of the user's vLLM checkout, and summarise the end.

The user's own work tree is never touched: bisect runs in `git worktree add --detach`, which
has its own HEAD and bisect refs, and is removed afterwards.
"""

from __future__ import annotations

import json
import math
import re
import shlex
import subprocess
from dataclasses import asdict, dataclass, field
from pathlib import Path

from pdcheck.bisect import git as g
from pdcheck.bisect.config import POLICIES, BisectConfig
from pdcheck.errors import BisectError

_FIRST_BAD = re.compile(r"^([0-9a-f]{40}) is the first bad commit", re.M)
_ONLY_SKIPPED = re.compile(
    r"only 'skip'ped commits left to test.*?could be any of:\n((?:[0-9a-f]{40}\n?)+)", re.S
)


@dataclass(frozen=True)
class BisectPlan:
    good: str
    bad: str
    commits: int
    expected_steps: int
    step_command: list[str]
    install: str
    policy: str

    def render(self) -> str:
        return "\n".join(
            [
                f"bisect {self.good[:12]}..{self.bad[:12]}: {self.commits} commits, about {self.expected_steps} steps",
                f"install per commit: {self.install}",
                f"policy: {self.policy} ({POLICIES[self.policy]})",
                f"step command (run by git bisect run in the worktree): {shlex.join(self.step_command)}",
            ]
        )


@dataclass(frozen=True)
class BisectResult:
    first_bad: g.CommitInfo | None
    candidates: tuple[str, ...]
    steps: list[dict] = field(default_factory=list)
    log_path: str = ""
    policy: str = ""

    def to_dict(self) -> dict:
        return {
            "schema_version": 1,
            "first_bad": asdict(self.first_bad) if self.first_bad else None,
            "candidates": list(self.candidates),
            "steps": self.steps,
            "log_path": self.log_path,
            "policy": self.policy,
        }

    def render_markdown(self) -> str:
        lines = ["## pdcheck bisect", ""]
        if self.first_bad:
            c = self.first_bad
            lines += [
                f"First bad commit: **{c.sha[:12]}** {c.subject}",
                "",
                f"Author: {c.author}, {c.author_date}",
                "",
            ]
        elif self.candidates:
            lines += ["Only skipped commits were left; the first bad commit is one of:", ""]
            lines += [f"- {sha[:12]}" for sha in self.candidates] + [""]
        else:
            lines += ["No first bad commit was found.", ""]
        lines += [
            f"Policy: {self.policy}. Steps:",
            "",
            "| commit | outcome | reason | cached |",
            "| --- | --- | --- | --- |",
        ]
        for s in self.steps:
            lines.append(
                f"| {s['sha'][:12]} | {s['outcome']} | {s['reason']} | {'yes' if s.get('cached') else 'no'} |"
            )
        return "\n".join(lines) + "\n"


def validate(cfg: BisectConfig) -> tuple[Path, str, str]:
    """Check the repo, refs, ancestry and cleanliness; returns (repo top, good sha, bad sha)."""
    repo = g.check_repo(cfg.vllm_repo)
    good = g.resolve_ref(repo, cfg.good, flag="--good")
    bad = g.resolve_ref(repo, cfg.bad, flag="--bad")
    g.check_ancestry(repo, good, bad)
    g.check_clean(repo)
    return repo, good, bad


def plan_bisect(cfg: BisectConfig) -> BisectPlan:
    repo, good, bad = validate(cfg)
    n = g.count_commits(repo, good, bad)
    return BisectPlan(
        good,
        bad,
        n,
        max(1, math.ceil(math.log2(n + 1))),
        cfg.step_argv(Path(cfg.out_dir) / "bisect-config.json"),
        cfg.install,
        cfg.policy,
    )


def run_bisect(cfg: BisectConfig) -> BisectResult:
    repo, good, bad = validate(cfg)
    out = Path(cfg.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    config_path = out / "bisect-config.json"
    config_path.write_text(cfg.model_dump_json(indent=2))
    (out / "steps.jsonl").unlink(missing_ok=True)
    worktree = cfg.worktree
    if worktree.exists():
        raise BisectError(f"{worktree} exists; remove it or choose another --out")
    g.git(repo, "worktree", "add", "--detach", str(worktree), bad)
    try:
        g.git(worktree, "bisect", "start", bad, good)
        proc = subprocess.run(
            ["git", "-C", str(worktree), "bisect", "run", *cfg.step_argv(config_path)],
            capture_output=True,
            text=True,
        )
        (out / "bisect-run.out").write_text(proc.stdout + proc.stderr)
        log = g.git(worktree, "bisect", "log", check=False).stdout
        (out / "bisect.log").write_text(log)
    finally:
        g.git(worktree, "bisect", "reset", check=False)
        g.git(repo, "worktree", "remove", "--force", str(worktree), check=False)
    text = proc.stdout + proc.stderr
    steps = (
        [json.loads(line) for line in (out / "steps.jsonl").read_text().splitlines()]
        if (out / "steps.jsonl").exists()
        else []
    )
    first = _FIRST_BAD.search(text)
    skipped = _ONLY_SKIPPED.search(text)
    if first is None and skipped is None and proc.returncode != 0:
        raise BisectError(
            f"git bisect run failed (exit {proc.returncode}); see {out / 'bisect-run.out'}"
        )
    result = BisectResult(
        first_bad=g.commit_info(repo, first.group(1)) if first else None,
        candidates=tuple(skipped.group(1).split()) if skipped else (),
        steps=steps,
        log_path=str(out / "bisect.log"),
        policy=cfg.policy,
    )
    (out / "bisect.json").write_text(json.dumps(result.to_dict(), indent=2))
    (out / "bisect.md").write_text(result.render_markdown())
    return result
