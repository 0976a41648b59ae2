"""Plan servers of a cell: each one's argv, env, ports, devices, log path and URL.

Pure apart from claiming free ports: nothing is started here, so `--dry-run` can print a
plan, and servers that do not fit their GPUs are refused before any process exists. A plan
holds exactly the servers that are to start together (a whole cell for `pdcheck up`, one
side of it for a sweep job), on exactly the devices given for them.
"""

from __future__ import annotations

import os
import shlex
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from pdcheck.config import Cell
from pdcheck.config.cells import ROLES
from pdcheck.serving.argv import (
    Platform,
    Role,
    ServerPorts,
    arm_needs_plugin,
    build_env,
    build_serve_argv,
)
from pdcheck.serving.devices import assign_cpu_binds, assign_gpus
from pdcheck.serving.forkserver import FORKED_NOTE, forkable
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
    gpus: tuple[str, ...] = ()  # as CUDA_VISIBLE_DEVICES names them; empty on CPU
    cpu_bind: str | None = None  # VLLM_CPU_OMP_THREADS_BIND on CPU

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
    """Servers of one cell that start together, and the proxy's port when decoders are among them."""

    cell_name: str
    platform: Platform
    servers: tuple[ServerPlan, ...]
    proxy_host: str
    proxy_port: int | None
    needs_plugin: bool
    ready_timeout_s: float
    async_scheduling: bool  # what the cell asks for; each server's scheduler reports what it got

    @property
    def prefills(self) -> tuple[ServerPlan, ...]:
        return tuple(s for s in self.servers if s.role == "prefill")

    @property
    def decodes(self) -> tuple[ServerPlan, ...]:
        return tuple(s for s in self.servers if s.role == "decode")

    @property
    def baseline(self) -> ServerPlan | None:
        return next((s for s in self.servers if s.role == "baseline"), None)

    @property
    def pd_url(self) -> str | None:
        return None if self.proxy_port is None else f"http://{self.proxy_host}:{self.proxy_port}"

    def render(self, prefill_urls: Sequence[str] = ()) -> str:
        """Every server as a shell line, then the proxy's command; `prefill_urls`: prefill servers
        already running (kept from an earlier job) that the proxy sends to."""
        lines = [f"# {self.cell_name} ({self.platform})"]
        if any(forkable(s.argv) for s in self.servers):
            lines.append(FORKED_NOTE)
        for server in self.servers:
            lines.append(f"# {server.name}: {server.url}  log: {server.log_path}")
            lines.append(server.render())
        if self.proxy_port is not None:
            urls = [*prefill_urls, *(s.url for s in self.prefills)]
            prefill = " ".join(f"--prefill {url}" for url in urls)
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
    roles: Sequence[Role] = ROLES,
    platform: Platform | None = None,
    launcher: Sequence[str] | None = None,
    cpu_count: int | None = None,
) -> TopologyPlan:
    """The servers of `roles` (every role by default), with disjoint ports and devices.

    `inventory` holds the devices for exactly these servers, handed out in order of `roles`;
    `platform` is the one resolved for the machine (default: resolved from `inventory`).
    Raises `GpuInventoryError` on a GPU platform when the servers do not fit the inventory.
    """
    platform = platform or resolve_platform(cell, inventory)
    servers_of = cell.servers(*roles)
    if platform == "gpu":
        gpu_sets = assign_gpus([(f"{r}-{i}", cell.tp(r)) for r, i in servers_of], inventory)
        binds: list[str | None] = [None] * len(servers_of)
    else:
        gpu_sets = [()] * len(servers_of)
        binds = list(
            assign_cpu_binds(
                [(r, cell.tp(r)) for r, _ in servers_of], cpu_count=cpu_count or os.cpu_count() or 1
            )
        )
    run = Path(run_dir)
    servers = []
    for (role, index), gpus, bind in zip(servers_of, gpu_sets, binds, strict=True):
        server_ports = ports.server_ports(tp=cell.tp(role))
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
                gpus=tuple(gpus),
                cpu_bind=bind,
            )
        )
    return TopologyPlan(
        cell_name=cell.name,
        platform=platform,
        servers=tuple(servers),
        proxy_host=cell.serving.host,
        proxy_port=ports.http_port() if "decode" in roles else None,
        needs_plugin=arm_needs_plugin(cell),
        ready_timeout_s=cell.serving.ready_timeout_s,
        async_scheduling=cell.async_scheduling,
    )
