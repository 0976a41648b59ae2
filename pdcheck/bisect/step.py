"""One `git bisect run` step: install the checked-out commit, run the predicate k times, exit 0/1/125.

Run as `python -m pdcheck.bisect.step CONFIG.json` inside the bisect worktree. Exit codes follow
git's convention: 0 the old term, 1 the new one, 125 skip (looking for a regression, old is the
predicate passing; looking for a fix, old is it failing). An infra failure (the commit does not build or
import, a server crashed, the harness could not run) is a skip, never "bad".
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from pdcheck.bisect import git as g
from pdcheck.bisect.config import BisectConfig
from pdcheck.bisect.imports import Prober, explain_failure, is_import_failure, subprocess_prober
from pdcheck.bisect.overlay import link_installed_files, overlay_env
from pdcheck.contracts.vllm_names import COMPILED_OPS_ERRORS
from pdcheck.errors import ExitCode

GOOD, BAD, SKIP = "good", "bad", "skip"


def git_exit(outcome: str, find: str) -> int:
    """The exit `git bisect run` reads: 0 for the old term, 1 for the new, 125 skip.

    A step's outcome is the predicate's (good: it passes). Looking for a regression, passing is
    old; looking for a fix, failing is old and passing is new.
    """
    if outcome == SKIP:
        return int(ExitCode.BISECT_SKIP)
    passes = outcome == GOOD
    return (1 if passes else 0) if find == "fix" else (0 if passes else 1)


@dataclass(frozen=True)
class StepResult:
    sha: str
    outcome: str  # good | bad | skip
    reason: str
    run_exit_codes: tuple[int, ...]
    seconds: float
    cached: bool = False

    def to_dict(self) -> dict:
        return asdict(self)


def decide_outcome(exit_codes: list[int], policy: str) -> tuple[str, str]:
    """Combine k predicate runs (0 good, 1 bad, anything else infra) under the policy."""
    bad = sum(1 for c in exit_codes if c == 1)
    good = sum(1 for c in exit_codes if c == 0)
    k = len(exit_codes)
    if policy == "any-bad":
        if bad:
            return BAD, f"{bad}/{k} runs bad (policy any-bad)"
        if good == k:
            return GOOD, f"{k}/{k} runs good (policy any-bad)"
        return SKIP, f"{k - good}/{k} runs hit infra errors and none was bad (policy any-bad)"
    if bad * 2 > k:
        return BAD, f"{bad}/{k} runs bad (policy majority)"
    if good * 2 > k:
        return GOOD, f"{good}/{k} runs good (policy majority)"
    return (
        SKIP,
        f"no majority: {good} good, {bad} bad, {k - good - bad} infra of {k} (policy majority)",
    )


def build_overlay(worktree: Path, sha: str, installed_vllm: Path, dest: Path) -> Path:
    """Lay the commit's `vllm/` Python sources over the installed vLLM's compiled parts.

    Returns the directory to put first on PYTHONPATH. Files the commit has come from git; the
    installed package adds only its non-`.py` files (compiled ops, data), never a module: an
    installed package (0.32's `vllm/multimodal/cache/`) would shadow the commit's `cache.py`.
    No build.
    """
    root = dest / sha
    if (root / "vllm" / "__init__.py").exists():
        return root
    dest.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix="overlay-", dir=dest))
    with tempfile.TemporaryFile() as archive:
        proc = subprocess.run(
            ["git", "-C", str(worktree), "archive", "--format=tar", sha, "vllm"],
            stdout=archive,
            stderr=subprocess.PIPE,
        )
        if proc.returncode != 0:
            raise RuntimeError(
                f"git archive {sha[:12]} vllm failed: {proc.stderr.decode().strip()}"
            )
        archive.seek(0)
        with tarfile.open(fileobj=archive) as tar:
            tar.extractall(tmp, filter="data")
    link_installed_files(installed_vllm, tmp / "vllm")
    tmp.rename(root)
    return root


def explain_infra(log_text: str, probe: Prober) -> str | None:
    """Why a run could not judge the commit, when the cause is the commit itself (so caching it is
    right): the compiled ABI, an import error (named as one), or internals the adapter lacks."""
    lines = [ln for ln in log_text.strip().splitlines() if ln.strip()]
    tail = lines[-1] if lines else "(no output)"
    if any(m in log_text for m in COMPILED_OPS_ERRORS):
        return f"the commit's compiled ABI is too far from the installed vLLM: {tail}"
    why = explain_failure(log_text, probe)
    if is_import_failure(why):
        return f"the commit {why}"
    if "VllmIncompatible" in log_text:
        return f"the harness cannot drive the commit: {why}"
    return None


def _predicate_argv(cfg: BisectConfig, run_dir: Path) -> list[str]:
    if cfg.predicate == "race":
        return [
            cfg.python,
            "-m",
            "pdcheck",
            "race",
            *cfg.args,
            "--out",
            str(run_dir / "race.json"),
        ]
    if cfg.predicate == "sweep":
        return [
            cfg.python,
            "-m",
            "pdcheck",
            "sweep",
            str(cfg.sweep_file),
            "--only",
            str(cfg.cell),
            "--out",
            str(run_dir / "results"),
        ]
    return list(cfg.args)


def run_step(cfg: BisectConfig) -> StepResult:
    start = time.monotonic()
    worktree = cfg.worktree
    sha = g.head_sha(worktree)
    cache_file = Path(cfg.cache_dir) / cfg.predicate_key() / f"{sha}.json"
    if cache_file.exists():
        data = json.loads(cache_file.read_text())
        return StepResult(
            **{**data, "run_exit_codes": tuple(data["run_exit_codes"]), "cached": True}
        )

    out = Path(cfg.out_dir)
    env = dict(os.environ, PDCHECK_BISECT_WORKTREE=str(worktree), PDCHECK_BISECT_COMMIT=sha)
    skip_reason = None
    if cfg.install == "overlay":
        try:
            overlay = build_overlay(
                worktree, sha, Path(str(cfg.installed_vllm_path)), out / "overlays"
            )
            env = overlay_env(overlay, env)
        except (RuntimeError, OSError) as exc:
            skip_reason = f"could not lay the commit over the installed vLLM: {exc}"
    elif cfg.install in ("pip", "custom"):
        argv = list(cfg.install_cmd) or [cfg.python, "-m", "pip", "install", "-e", str(worktree)]
        proc = subprocess.run(
            argv,
            cwd=worktree,
            capture_output=True,
            text=True,
            env=dict(env, VLLM_USE_PRECOMPILED="1"),
        )
        if proc.returncode != 0:
            tail = (proc.stderr.strip().splitlines() or ["(no output)"])[-1]
            skip_reason = f"install failed (exit {proc.returncode}): {tail}"

    codes: list[int] = []
    if skip_reason is None:
        for k in range(cfg.repeats):
            run_dir = out / "steps" / sha[:12] / f"r{k}"
            run_dir.mkdir(parents=True, exist_ok=True)
            with open(run_dir / "output.log", "w") as log:
                predicate_proc = subprocess.run(
                    _predicate_argv(cfg, run_dir),
                    cwd=worktree if cfg.predicate == "cmd" else out,
                    env=env,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                )
            codes.append(predicate_proc.returncode)
            if predicate_proc.returncode not in (0, 1):
                probe = subprocess_prober(cfg.python, env, cwd=str(out))
                why = explain_infra((run_dir / "output.log").read_text(errors="replace"), probe)
                if why is not None:
                    skip_reason = why
                    break
        outcome, reason = decide_outcome(codes, cfg.policy)
        if skip_reason is not None:
            outcome, reason = SKIP, skip_reason
    else:
        outcome, reason = SKIP, skip_reason

    result = StepResult(sha, outcome, reason, tuple(codes), round(time.monotonic() - start, 2))
    # Infra skips (a crash) may pass on a retry; commits that are good, bad, or skipped for a
    # cause in the commit itself (install, import, ABI, missing internals) are cached.
    if outcome != SKIP or skip_reason is not None:
        cache_file.parent.mkdir(parents=True, exist_ok=True)
        cache_file.write_text(json.dumps(result.to_dict()))
    return result


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    cfg = BisectConfig.model_validate_json(Path(argv[0]).read_text())
    try:
        result = run_step(cfg)
    except Exception as exc:
        result = StepResult(
            g.head_sha(cfg.worktree), SKIP, f"step failed: {type(exc).__name__}: {exc}", (), 0.0
        )
    with open(Path(cfg.out_dir) / "steps.jsonl", "a") as f:
        f.write(json.dumps(result.to_dict()) + "\n")
    print(
        f"pdcheck bisect step {result.sha[:12]}: {result.outcome} ({result.reason})"
        + (" [cached]" if result.cached else ""),
        flush=True,
    )
    return git_exit(result.outcome, cfg.find)


if __name__ == "__main__":
    sys.exit(main())
