"""Thin, checked wrappers over the git commands bisect needs (argv lists, never a shell)."""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path

from pdcheck.errors import BisectError


def git(
    repo: str | Path, *args: str, check: bool = True, timeout_s: float = 120
) -> subprocess.CompletedProcess:
    proc = subprocess.run(
        ["git", "-C", str(repo), *args], capture_output=True, text=True, timeout=timeout_s
    )
    if check and proc.returncode != 0:
        raise BisectError(
            f"git {' '.join(args)} failed in {repo}: {proc.stderr.strip() or proc.stdout.strip()}"
        )
    return proc


@dataclass(frozen=True)
class CommitInfo:
    sha: str
    subject: str
    author: str
    author_date: str


def check_repo(repo: str | Path) -> Path:
    path = Path(repo)
    if not path.is_dir():
        raise BisectError(f"--vllm-repo {repo}: no such directory; give a vLLM git checkout")
    proc = git(path, "rev-parse", "--show-toplevel", check=False)
    if proc.returncode != 0:
        raise BisectError(f"--vllm-repo {repo} is not a git repository; give a vLLM git checkout")
    return Path(proc.stdout.strip())


def resolve_ref(repo: Path, ref: str, *, flag: str) -> str:
    proc = git(repo, "rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}", check=False)
    if proc.returncode != 0:
        raise BisectError(
            f"{flag} {ref!r} is not a commit in {repo}; give a branch, tag or sha that exists there"
        )
    return proc.stdout.strip()


def check_ancestry(repo: Path, good: str, bad: str) -> None:
    if good == bad:
        raise BisectError("--good and --bad name the same commit; nothing to bisect")
    if git(repo, "merge-base", "--is-ancestor", good, bad, check=False).returncode != 0:
        raise BisectError(
            f"--good {good[:12]} is not an ancestor of --bad {bad[:12]}; bisect needs good before bad"
        )


def check_clean(repo: Path) -> None:
    """Refuse a dirty work tree: pdcheck never stashes or resets the user's work."""
    status = git(repo, "status", "--porcelain", "--untracked-files=no").stdout.strip()
    if status:
        lines = status.splitlines()
        shown = "\n  ".join(lines[:10]) + ("\n  ..." if len(lines) > 10 else "")
        raise BisectError(
            f"the work tree of {repo} has uncommitted changes; commit or stash them yourself first "
            f"(pdcheck never touches your work):\n  {shown}"
        )


def count_commits(repo: Path, good: str, bad: str) -> int:
    return int(git(repo, "rev-list", "--count", f"{good}..{bad}").stdout.strip())


def commit_info(repo: Path, sha: str) -> CommitInfo:
    out = git(repo, "show", "-s", "--format=%H%n%s%n%an <%ae>%n%aI", sha).stdout.splitlines()
    return CommitInfo(sha=out[0], subject=out[1], author=out[2], author_date=out[3])


def head_sha(repo: Path) -> str:
    return git(repo, "rev-parse", "HEAD").stdout.strip()
