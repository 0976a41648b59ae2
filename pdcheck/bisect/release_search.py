"""Bisect an ordered list of releases with a judge: endpoints first, then logarithmic steps.

`--find regression` looks for the first release with the race (old releases clean, new ones
racy); `--find fix` for the first release without it (git's old/new terms: old racy, new
clean). The search is pure: the judge is passed in, so the logic is tested with a fake one.
An untestable release is skipped, as `git bisect skip` does, and the next nearest is tried.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal

from pdcheck.bisect.release_run import CLEAN, RACE, UNTESTABLE, ReleaseVerdict
from pdcheck.errors import BisectError, HarnessError

Find = Literal["fix", "regression"]
# (the old end's outcome, the new end's outcome) for each direction.
TERMS: dict[str, tuple[str, str]] = {"regression": (CLEAN, RACE), "fix": (RACE, CLEAN)}


def expected_steps(releases: int) -> int:
    """Harness runs when nothing is skipped: both ends, then ceil(log2) of the gap between them."""
    inner = max(0, releases - 2)
    return 2 + (math.ceil(math.log2(inner + 1)) if inner else 0)


@dataclass(frozen=True)
class ReleaseBisectResult:
    """The search's end: the first new release (or the candidates skips left), and every verdict."""

    find: str
    first_new: str | None  # the first release with the fix (find=fix) or the race (regression)
    candidates: tuple[str, ...]  # when skips left several: one of these is first
    verdicts: tuple[ReleaseVerdict, ...]  # in the order they were tested

    @property
    def found(self) -> bool:
        return self.first_new is not None


def check_endpoint(verdict: ReleaseVerdict, expected: str, *, end: str, find: str) -> None:
    if verdict.outcome == UNTESTABLE:
        raise HarnessError(
            f"the {end} release {verdict.release} could not be tested (exit {verdict.exit_code}): "
            f"{verdict.reason}"
        )
    if verdict.outcome != expected:
        raise BisectError(
            f"--find {find} needs the {end} release {verdict.release} to be {expected}, but the "
            f"harness found it {verdict.outcome} (exit {verdict.exit_code}); "
            + (
                "swap --find, or pick other endpoints"
                if verdict.outcome in (CLEAN, RACE)
                else "pick other endpoints"
            )
        )


def _next_probe(lo: int, hi: int, skipped: set[int]) -> int | None:
    """The untested index in (lo, hi) nearest the middle, or None when only skips are left."""
    mid = (lo + hi) // 2
    order = sorted(range(lo + 1, hi), key=lambda i: (abs(i - mid), i))
    return next((i for i in order if i not in skipped), None)


def search_releases(
    releases: Sequence[str],
    judge: Callable[[str], ReleaseVerdict],
    *,
    find: Find,
    on_verdict: Callable[[ReleaseVerdict], None] | None = None,
) -> ReleaseBisectResult:
    """Judge both ends (stopping if either contradicts `find` or cannot run), then bisect."""
    if len(releases) < 2:
        raise BisectError("a release bisect needs at least two releases")
    old, new = TERMS[find]
    verdicts: list[ReleaseVerdict] = []

    def run(release: str) -> ReleaseVerdict:
        verdict = judge(release)
        verdicts.append(verdict)
        if on_verdict is not None:
            on_verdict(verdict)
        return verdict

    check_endpoint(run(releases[0]), old, end="first", find=find)
    check_endpoint(run(releases[-1]), new, end="last", find=find)
    lo, hi = 0, len(releases) - 1
    skipped: set[int] = set()
    while (probe := _next_probe(lo, hi, skipped)) is not None:
        outcome = run(releases[probe]).outcome
        if outcome == old:
            lo = probe
        elif outcome == new:
            hi = probe
        else:
            skipped.add(probe)
    left = sorted(i for i in skipped if lo < i < hi)
    if not left:
        return ReleaseBisectResult(find, releases[hi], (), tuple(verdicts))
    return ReleaseBisectResult(find, None, tuple(releases[i] for i in [*left, hi]), tuple(verdicts))


def render_markdown(result: ReleaseBisectResult, *, title: str) -> str:
    """The report a reviewer reads: the answer, then one row per release tested."""
    what = "the fix (no race)" if result.find == "fix" else "the race"
    lines = [f"## {title}", ""]
    if result.first_new:
        lines += [f"First release with {what}: **{result.first_new}**", ""]
    else:
        lines += [
            f"No single first release with {what}: releases between the last "
            f"{TERMS[result.find][0]} one and the first {TERMS[result.find][1]} one could not be "
            "tested. It is one of: " + ", ".join(result.candidates),
            "",
        ]
    lines += [
        "| # | release | verdict | race exit | findings (seeds by family) | fix forms | seconds | note |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for n, v in enumerate(result.verdicts, 1):
        families = ", ".join(f"{k} {c}" for k, c in v.families.items()) or "-"
        fixes = "; ".join(f"{k}: {s}" for k, s in v.fixes.items()) or "-"
        note = v.reason.replace("|", "\\|") if v.reason else ""
        lines.append(
            f"| {n} | {v.release} | {v.outcome} | {v.exit_code} | {families} | {fixes} | "
            f"{v.seconds:g} | {note} |"
        )
    return "\n".join(lines) + "\n"
