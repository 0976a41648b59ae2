"""Run the race harness on a released vLLM's Python: fetch the wheel, build the overlay, run a child.

The child is `python -m pdcheck race ...` with the overlay first on PYTHONPATH, so vLLM is
imported only there. Its summary JSON is the verdict's source: the exit code, the findings'
families and the fix forms are read from it, never recomputed here.
"""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pdcheck.bisect.imports import Prober, explain_failure, subprocess_prober
from pdcheck.bisect.overlay import (
    InstalledVllm,
    Overlay,
    build_release_overlay,
    fetch_wheel,
    overlay_env,
)
from pdcheck.contracts.fixes import statuses_from_record

RACE, CLEAN, UNTESTABLE = "race", "clean", "untestable"
# The hidden `pdcheck race` option that tells the child which release it runs (replay lines).
RELEASE_LABEL_OPTION = "--release-label"


@dataclass(frozen=True)
class ReleaseCache:
    """Where wheels and overlays live: `<cache>/vllm-releases/{wheels,overlays}`."""

    root: Path

    @property
    def wheels(self) -> Path:
        return self.root / "wheels"

    @property
    def overlays(self) -> Path:
        return self.root / "overlays"


@dataclass(frozen=True)
class ReleaseVerdict:
    """One release judged by the harness: its exit code and what its summary says."""

    release: str
    outcome: str  # race | clean | untestable
    exit_code: int
    families: dict[str, int] = field(default_factory=dict)  # family -> seeds with it, all variants
    fixes: dict[str, str] = field(default_factory=dict)  # fix -> form/state as the summary says
    reason: str = ""
    seconds: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "release": self.release,
            "outcome": self.outcome,
            "exit_code": self.exit_code,
            "families": self.families,
            "fixes": self.fixes,
            "reason": self.reason,
            "seconds": self.seconds,
        }


def fixes_from_summary(summary: dict[str, Any]) -> dict[str, str]:
    """The fixes the race summary names, as `fix -> "present (form)"`, `absent` or `unknown`."""
    return {
        fix: status.describe() for fix, status in statuses_from_record(summary.get("fixes")).items()
    }


def families_from_summary(summary: dict[str, Any]) -> dict[str, int]:
    total: dict[str, int] = {}
    for variant in summary.get("variants", []):
        for family, n in variant.get("seeds_by_family", {}).items():
            total[family] = total.get(family, 0) + int(n)
    return dict(sorted(total.items()))


def verdict_from_run(
    release: str, exit_code: int, summary: dict[str, Any] | None, reason: str, seconds: float
) -> ReleaseVerdict:
    """Exit 1 with a summary is a race, exit 0 clean; anything else could not judge the release."""
    if summary is not None and exit_code in (0, 1):
        version = str(summary.get("vllm_version", ""))
        if version and version != release and not version.startswith(release + "+"):
            # The child imported another vLLM than the overlay's: its answer is not this release's.
            reason = f"the harness ran vLLM {version}, not {release}: the overlay was not imported"
            return ReleaseVerdict(release, UNTESTABLE, 2, reason=reason, seconds=seconds)
        return ReleaseVerdict(
            release,
            RACE if exit_code == 1 else CLEAN,
            exit_code,
            families_from_summary(summary),
            fixes_from_summary(summary),
            reason,
            seconds,
        )
    return ReleaseVerdict(release, UNTESTABLE, exit_code, reason=reason, seconds=seconds)


def prepare_release(
    release: str, installed: InstalledVllm, cache: ReleaseCache, *, python: str
) -> Overlay:
    """Fetch (once) and lay the release's Python over the installed build."""
    wheel = fetch_wheel(release, cache.wheels, python=python)
    return build_release_overlay(release, wheel, installed, cache.overlays, python=python)


def run_release_race(
    overlay: Overlay,
    race_args: Sequence[str],
    *,
    python: str,
    json_path: Path,
    log_path: Path,
    stdout: int | None = None,
    prober: Callable[[dict[str, str]], Prober] | None = None,
) -> ReleaseVerdict:
    """Run `python -m pdcheck race RACE_ARGS` on the overlay; the child's stderr goes to `log_path`.

    `stdout` is where the child's own report goes (None: this process's stdout).
    """
    env = overlay_env(overlay.root)
    json_path.parent.mkdir(parents=True, exist_ok=True)
    json_path.unlink(missing_ok=True)
    argv = [python, "-m", "pdcheck", "race", *race_args, "--out", str(json_path)]
    argv += [RELEASE_LABEL_OPTION, overlay.release]
    start = time.monotonic()
    with open(log_path, "w") as log:
        proc = subprocess.run(argv, env=env, stdout=stdout, stderr=log)
    seconds = round(time.monotonic() - start, 1)
    summary = None
    if proc.returncode in (0, 1) and json_path.exists():
        summary = json.loads(json_path.read_text())
    reason = ""
    if summary is None:
        text = log_path.read_text(errors="replace")
        make = prober or (lambda e: subprocess_prober(python, e))
        reason = explain_failure(text, make(env))
    return verdict_from_run(overlay.release, proc.returncode, summary, reason, seconds)
