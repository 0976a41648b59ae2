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
from pdcheck.errors import BisectError, HarnessError

_FIRST_NEW = re.compile(r"^([0-9a-f]{40}) is the first (\w+) commit", re.M)
_ONLY_SKIPPED = re.compile(
    r"only 'skip'ped commits left to test.*?could be any of:\n((?:[0-9a-f]{40}\n?)+)", re.S
)


def estimate_steps(commits: int, *, known_skips: int = 0, endpoints: bool = True) -> int:
    """Steps when no new commit is skipped: the endpoints, about log2 of the range, and one per
    commit already known to be untestable (each skip costs git a step beside it)."""
    base = max(1, math.ceil(math.log2(commits + 1)))
    return base + min(known_skips, max(0, commits - 1)) + (2 if endpoints else 0)


@dataclass(frozen=True)
class BisectPlan:
    good: str
    bad: str
    commits: int
    expected_steps: int
    step_command: list[str]
    install: str
    policy: str
    known_skips: int = 0
    find: str = "regression"

    def render(self) -> str:
        skips = f", {self.known_skips} of them cached as untestable" if self.known_skips else ""
        return "\n".join(
            [
                f"bisect {self.good[:12]}..{self.bad[:12]} (--find {self.find}): "
                f"{self.commits} commits{skips}, about {self.expected_steps} steps "
                f"if nothing else is skipped (each skipped commit costs a step; at most "
                f"{self.commits + 1})",
                f"install per commit: {self.install}",
                f"policy: {self.policy} ({POLICIES[self.policy]})",
                f"step command (run by git bisect run in the worktree): {shlex.join(self.step_command)}",
            ]
        )


@dataclass(frozen=True)
class BisectResult:
    first_bad: g.CommitInfo | None  # the first commit of the new term (bad, or fixed)
    candidates: tuple[str, ...]
    steps: list[dict] = field(default_factory=list)
    log_path: str = ""
    policy: str = ""
    find: str = "regression"
    new_endpoint: str = ""  # the sha of the new end (bad, or fixed)

    def to_dict(self) -> dict:
        return {
            "schema_version": 1,
            "first_bad": asdict(self.first_bad) if self.first_bad else None,
            "candidates": list(self.candidates),
            "steps": self.steps,
            "log_path": self.log_path,
            "policy": self.policy,
            "find": self.find,
        }

    @property
    def new_term(self) -> str:
        return "fixed" if self.find == "fix" else "bad"

    def none_new_between(self) -> bool:
        """True when no tested commit before the new endpoint was of the new term."""
        new = "good" if self.find == "fix" else "bad"
        return not any(s["outcome"] == new for s in self.steps if s["sha"] != self.new_endpoint)

    def render_markdown(self) -> str:
        lines = ["## pdcheck bisect", ""]
        if self.first_bad:
            c = self.first_bad
            lines += [
                f"First {self.new_term} commit: **{c.sha[:12]}** {c.subject}",
                "",
                f"Author: {c.author}, {c.author_date}",
                "",
            ]
        elif self.candidates and self.none_new_between():
            # Every commit git could test before the new end was old: say so, rather than
            # "one of N" as if a culprit had been narrowed down.
            skipped = [c for c in self.candidates if c != self.new_endpoint]
            lines += [
                f"No {self.new_term} commit was found before the new endpoint "
                f"{self.new_endpoint[:12]}: every commit tested between the endpoints was "
                f"{'broken' if self.find == 'fix' else 'good'}, and {len(skipped)} could not be "
                f"tested (skipped). The first {self.new_term} commit is the endpoint itself or "
                "one of those skipped:",
                "",
            ]
            lines += [f"- {sha[:12]}" for sha in skipped] + [""]
        elif self.candidates:
            lines += [
                f"Only skipped commits were left; the first {self.new_term} commit is one of:",
                "",
            ]
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


def cached_outcome(cfg: BisectConfig, sha: str) -> str | None:
    """A commit's cached step outcome under this predicate, if any."""
    path = Path(cfg.cache_dir) / cfg.predicate_key() / f"{sha}.json"
    try:
        return str(json.loads(path.read_text())["outcome"])
    except (OSError, ValueError, KeyError):
        return None


def plan_bisect(cfg: BisectConfig) -> BisectPlan:
    repo, good, bad = validate(cfg)
    shas = g.git(repo, "rev-list", f"{good}..{bad}").stdout.split()
    known_skips = sum(1 for sha in shas if cached_outcome(cfg, sha) == "skip")
    return BisectPlan(
        good,
        bad,
        len(shas),
        estimate_steps(len(shas), known_skips=known_skips, endpoints=cfg.check_endpoints),
        cfg.step_argv(Path(cfg.out_dir) / "bisect-config.json"),
        cfg.install,
        cfg.policy,
        known_skips,
        cfg.find,
    )


def _expected_outcomes(find: str) -> tuple[str, str]:
    """The step outcomes (old end, new end) a search in this direction needs."""
    return ("bad", "good") if find == "fix" else ("good", "bad")


def check_endpoint(step: dict, expected: str, *, end: str, flag: str, find: str) -> None:
    """Stop when an endpoint cannot be tested (exit 2) or contradicts --find (exit 3)."""
    sha = step["sha"][:12]
    if step["outcome"] == "skip":
        raise HarnessError(f"the {end} endpoint {flag} {sha} could not be tested: {step['reason']}")
    if step["outcome"] != expected:
        want = "passes" if expected == "good" else "fails"
        raise BisectError(
            f"--find {find} needs the predicate to {want.removesuffix('s')} on the {end} "
            f"endpoint, but on {flag} {sha} it was {step['outcome']} ({step['reason']}); "
            "swap --find or the endpoints, or pick others"
        )


def _test_endpoints(
    cfg: BisectConfig, worktree: Path, config_path: Path, good: str, bad: str
) -> None:
    steps_file = Path(cfg.out_dir) / "steps.jsonl"
    old, new = _expected_outcomes(cfg.find)
    for sha, expected, end, flag in ((good, old, "old", "--good"), (bad, new, "new", "--bad")):
        g.git(worktree, "checkout", "-q", "--detach", sha)
        subprocess.run(cfg.step_argv(config_path), cwd=worktree, capture_output=True, text=True)
        last = steps_file.read_text().splitlines()[-1] if steps_file.exists() else ""
        step = json.loads(last) if last else {"sha": sha, "outcome": "skip", "reason": "no result"}
        check_endpoint(step, expected, end=end, flag=flag, find=cfg.find)


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
    old_term, new_term = cfg.terms
    try:
        if cfg.check_endpoints:
            _test_endpoints(cfg, worktree, config_path, good, bad)
        # git's own good/bad need no --term options.
        terms = (
            [] if cfg.find == "regression" else [f"--term-old={old_term}", f"--term-new={new_term}"]
        )
        started = g.git(worktree, "bisect", "start", *terms, bad, good)
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
    # With adjacent endpoints `bisect start` already names the first new commit.
    text = started.stdout + proc.stdout + proc.stderr
    steps = (
        [json.loads(line) for line in (out / "steps.jsonl").read_text().splitlines()]
        if (out / "steps.jsonl").exists()
        else []
    )
    first = _FIRST_NEW.search(text)
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
        find=cfg.find,
        new_endpoint=bad,
    )
    (out / "bisect.json").write_text(json.dumps(result.to_dict(), indent=2))
    (out / "bisect.md").write_text(result.render_markdown())
    return result
