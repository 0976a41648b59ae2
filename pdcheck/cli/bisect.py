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


@click.command()
@click.option(
    "--vllm-repo",
    required=True,
    type=click.Path(file_okay=False),
    help="A vLLM git checkout (left untouched).",
)
@click.option("--good", required=True, help="A commit where the predicate passes.")
@click.option("--bad", required=True, help="A later commit where it fails.")
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
    """Bisect a vLLM checkout between GOOD and BAD with a pdcheck predicate.

    \b
    Each step exits as git expects: 0 good, 1 bad, 125 skip (the commit does not install or
    import, or the run hit an infra error; an infra failure is never called bad). Results are
    cached per commit, so re-running or widening a bisect reuses earlier steps.
    Exit: 0 the first bad commit was found; 1 only skipped commits were left (listed: the first
    bad commit is one of them); 2 git bisect ended without naming a commit; 3 bad input.
    """
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
        args = ["--seeds", str(seeds)] + (["--requests", str(requests)] if requests else [])
        args += [a for v in variant for a in ("--variant", v)]
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
