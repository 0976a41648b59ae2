"""Plan a topology for a cell: every server's argv, env, ports, devices, log path and URL.

Pure apart from checking that ports are free: nothing is started here, so `--dry-run` can
print a plan and a topology that does not fit the GPUs is refused before any process exists.
"""

from __future__ import annotations

import os
import shlex
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from pdcheck.config import Cell
from pdcheck.serving.argv import (
    Platform,
    Role,
    ServerPorts,
    arm_needs_plugin,
    build_env,
    build_serve_argv,
    tp_for,
)
from pdcheck.serving.devices import assign_cpu_binds, assign_gpus
from pdcheck.serving.gpus import GpuInventory
from pdcheck.serving.ports import PortAllocator


@dataclass(frozen=True)
class ServerPlan:
    """One vLLM server to start."""

    role: Role
    index: int
    argv: tuple[str, ...]
    env: dict[str, str]
    ports: ServerPorts
    host: str
    log_path: Path
    plugin_dir: Path

    @property
    def name(self) -> str:
        return f"{self.role}-{self.index}"

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.ports.http}"

    def render(self) -> str:
        """The server as one copy-pasteable shell line (env assignments, then argv)."""
        assigns = " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(self.env.items()))
        return f"{assigns} {shlex.join(self.argv)}".strip()


@dataclass(frozen=True)
class TopologyPlan:
    """The no-PD baseline, the prefill and decode servers, and the proxy port of one cell."""

    cell_name: str
    platform: Platform
    baseline: ServerPlan
    prefills: tuple[ServerPlan, ...]
    decodes: tuple[ServerPlan, ...]
    proxy_host: str
    proxy_port: int
    needs_plugin: bool
    ready_timeout_s: float
    async_scheduling: bool  # what the cell asks for; each server's scheduler reports what it got

    @property
    def servers(self) -> tuple[ServerPlan, ...]:
        return (*self.prefills, *self.decodes, self.baseline)

    @property
    def pd_url(self) -> str:
        return f"http://{self.proxy_host}:{self.proxy_port}"

    def render(self) -> str:
        lines = [f"# {self.cell_name} ({self.platform})"]
        for server in self.servers:
            lines.append(f"# {server.name}: {server.url}  log: {server.log_path}")
            lines.append(server.render())
        prefill = " ".join(f"--prefill {s.url}" for s in self.prefills)
        decode = " ".join(f"--decode {s.url}" for s in self.decodes)
        lines.append(f"# proxy: {self.pd_url}")
        lines.append(
            f"pdcheck proxy {prefill} {decode} --host {self.proxy_host} --port {self.proxy_port}"
        )
        return "\n".join(lines)


def resolve_platform(cell: Cell, inventory: GpuInventory) -> Platform:
    """`serving.platform`, with `auto` meaning GPU when the inventory has any."""
    if cell.serving.platform != "auto":
        return cell.serving.platform
    return "gpu" if inventory.count else "cpu"


def plan_topology(
    cell: Cell,
    *,
    inventory: GpuInventory,
    ports: PortAllocator,
    run_dir: str | Path,
    launcher: Sequence[str] | None = None,
    cpu_count: int | None = None,
) -> TopologyPlan:
    """Every server of the cell's baseline and PD topology, with disjoint ports and devices.

    Raises `GpuInventoryError` on a GPU platform when the servers do not fit the inventory.
    """
    platform = resolve_platform(cell, inventory)
    roles: list[tuple[Role, int]] = [("prefill", i) for i in range(cell.prefill_instances)]
    roles += [("decode", i) for i in range(cell.decode_instances)]
    roles.append(("baseline", 0))
    sizes = [(f"{role}-{i}", tp_for(cell, role)) for role, i in roles]
    if platform == "gpu":
        gpu_sets = assign_gpus(sizes, inventory)
        binds: list[str | None] = [None] * len(roles)
    else:
        gpu_sets = [()] * len(roles)
        binds = list(
            assign_cpu_binds(
                [(r, tp_for(cell, r)) for r, _ in roles], cpu_count=cpu_count or os.cpu_count() or 1
            )
        )
    run = Path(run_dir)
    servers = []
    for (role, index), gpus, bind in zip(roles, gpu_sets, binds, strict=True):
        server_ports = ports.server_ports(tp=tp_for(cell, role))
        plugin_dir = run / "plugin" / f"{role}-{index}"
        servers.append(
            ServerPlan(
                role=role,
                index=index,
                argv=tuple(
                    build_serve_argv(
                        cell,
                        role=role,
                        port=server_ports.http,
                        platform=platform,
                        launcher=launcher,
                    )
                ),
                env=build_env(
                    cell,
                    role=role,
                    ports=server_ports,
                    platform=platform,
                    gpus=gpus,
                    cpu_bind=bind,
                    plugin_dir=str(plugin_dir),
                ),
                ports=server_ports,
                host=cell.serving.host,
                log_path=run / "logs" / f"{role}-{index}.log",
                plugin_dir=plugin_dir,
            )
        )
    return TopologyPlan(
        cell_name=cell.name,
        platform=platform,
        prefills=tuple(s for s in servers if s.role == "prefill"),
        decodes=tuple(s for s in servers if s.role == "decode"),
        baseline=servers[-1],
        proxy_host=cell.serving.host,
        proxy_port=ports.http_port(),
        needs_plugin=arm_needs_plugin(cell),
        ready_timeout_s=cell.serving.ready_timeout_s,
        async_scheduling=cell.async_scheduling,
    )
