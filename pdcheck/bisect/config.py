"""What one bisect runs: the predicate, its repeats and policy, and how each commit is installed."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

Predicate = Literal["race", "sweep", "cmd"]
Policy = Literal["any-bad", "majority"]
Install = Literal["overlay", "pip", "custom", "none"]
# git's old/new terms: a regression is looked for from good (old) to bad (new); a fix from a
# commit where the predicate fails (old) to one where it passes (new).
Find = Literal["regression", "fix"]
GIT_TERMS: dict[str, tuple[str, str]] = {"regression": ("good", "bad"), "fix": ("broken", "fixed")}

POLICIES = {
    "any-bad": "bad if any run is bad; good only if every run is good; otherwise skip",
    "majority": "bad if more than half the runs are bad, good if more than half are good; otherwise skip",
}


class BisectConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    vllm_repo: str
    good: str  # the old endpoint (with --find fix: a commit where the predicate fails)
    bad: str  # the new endpoint (with --find fix: a commit where it passes)
    find: Find = "regression"
    # Test both endpoints before bisecting (off only for histories whose ends are known).
    check_endpoints: bool = True
    predicate: Predicate
    # race: extra `pdcheck race` options; cmd: the command; sweep: unused.
    args: tuple[str, ...] = ()
    sweep_file: str | None = None
    cell: str | None = None
    repeats: int = Field(1, ge=1)
    policy: Policy = "any-bad"
    install: Install = "overlay"
    install_cmd: tuple[str, ...] = ()
    # The interpreter that runs each step's predicate (has pdcheck, and vLLM for overlays).
    python: str
    installed_vllm_path: str | None = None
    installed_vllm_version: str | None = None
    out_dir: str
    cache_dir: str

    @property
    def worktree(self) -> Path:
        return Path(self.out_dir) / "worktree"

    def predicate_key(self) -> str:
        """Results are cached per commit under this key: same predicate, same answers."""
        key = {
            "predicate": self.predicate,
            "args": self.args,
            "sweep_file": self.sweep_file,
            "cell": self.cell,
            "repeats": self.repeats,
            "policy": self.policy,
            "install": self.install,
            "install_cmd": self.install_cmd,
            "python": self.python,
            "installed_vllm_version": self.installed_vllm_version,
        }
        return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]

    @property
    def terms(self) -> tuple[str, str]:
        """git bisect's (old, new) terms for this search."""
        return GIT_TERMS[self.find]

    def step_argv(self, config_path: str | Path) -> list[str]:
        return [self.python, "-m", "pdcheck.bisect.step", str(config_path)]
