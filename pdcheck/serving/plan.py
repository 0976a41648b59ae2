"""Plan servers of a cell: each one's argv, env, ports, devices, log path and URL.

Pure apart from claiming free ports: nothing is started here, so `--dry-run` can print a
plan, and servers that do not fit their GPUs are refused before any process exists. A plan
holds exactly the servers that are to start together (a whole cell for `pdcheck up`, one
side of it for a sweep job), on exactly the devices given for them; when they share GPUs
(`serving.devices`), with each one's memory share and start stage.
"""

from __future__ import annotations

import os
import shlex
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from pdcheck.config import Cell
from pdcheck.config.cells import ROLES
from pdcheck.errors import ConfigError
from pdcheck.serving.argv import (
    GPU_MEMORY_FLAG,
    Platform,
    Role,
    ServerPorts,
    arm_needs_plugin,
    build_env,
    build_serve_argv,
    flag_value,
    user_serve_args,
)
from pdcheck.serving.devices import (
    COLOCATED_MEMORY_BUDGET,
    GpuShare,
    assign_cpu_binds,
    assign_gpus,
)
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
    # The share of its GPUs' memory it runs with when it shares them; None: they are its own.
    memory_share: float | None = None
    # Starts once every server of its job in an earlier stage is ready (co-located servers).
    start_stage: int = 0

    @property
    def name(self) -> str:
        return f"{self.role}-{self.index}"

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.ports.http}"

    @property
    def placement(self) -> str:
        """Where it runs, for a plan's text: its GPUs, memory share and start stage."""
        if not self.gpus:
            return ""
        where = f"GPU {','.join(self.gpus)}"
        if self.memory_share is None:
            return f"{where} (its own)"
        stage = f", start stage {self.start_stage}" if self.start_stage else ""
        return f"{where} shared, memory share {self.memory_share:g}{stage}"

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
        if any(s.start_stage for s in self.servers):
            lines.append(STAGED_NOTE)
        for server in self.servers:
            where = f"  {server.placement}" if server.placement else ""
            lines.append(f"# {server.name}: {server.url}{where}  log: {server.log_path}")
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


STAGED_NOTE = (
    "# servers sharing a GPU start one stage at a time, each once the earlier stages are ready: "
    "vLLM counts memory that changes on the device during its start as its own"
)
# vLLM's default `--gpu-memory-utilization` (CacheConfig, 0.32 and 0.33).
VLLM_DEFAULT_MEMORY_SHARE = 0.92


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
    job_roles: Sequence[Role] | None = None,
) -> TopologyPlan:
    """The servers of `roles` (every role by default), with disjoint ports and their devices.

    `inventory` holds the devices of the job the servers belong to: the servers of `job_roles`
    (default `roles`), handed out in that order, of which those of `roles` are planned (a sweep
    starts a PD job's prefill and decode servers apart, on the GPUs of the whole job).
    `platform` is the one resolved for the machine (default: resolved from `inventory`).
    Raises `GpuInventoryError` on a GPU platform when a server's TP exceeds the inventory, and
    `ConfigError` when servers sharing a GPU ask for more than its memory together.
    """
    platform = platform or resolve_platform(cell, inventory)
    servers_of = cell.servers(*roles)
    job_servers = cell.servers(*(job_roles or roles))
    if platform == "gpu":
        shares = dict(
            zip(
                job_servers,
                assign_gpus([(f"{r}-{i}", cell.tp(r)) for r, i in job_servers], inventory),
                strict=True,
            )
        )
        check_memory_shares(cell, shares)
        gpu_shares = [shares[s] for s in servers_of]
        binds: list[str | None] = [None] * len(servers_of)
    else:
        gpu_shares = [GpuShare(())] * len(servers_of)
        binds = list(
            assign_cpu_binds(
                [(r, cell.tp(r)) for r, _ in servers_of], cpu_count=cpu_count or os.cpu_count() or 1
            )
        )
    run = Path(run_dir)
    servers = []
    for (role, index), share, bind in zip(servers_of, gpu_shares, binds, strict=True):
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
                        memory_share=share.memory_share,
                    )
                ),
                env=build_env(
                    cell,
                    role=role,
                    ports=server_ports,
                    platform=platform,
                    gpus=share.devices,
                    cpu_bind=bind,
                    plugin_dir=str(plugin_dir),
                ),
                ports=server_ports,
                host=cell.serving.host,
                log_path=run / "logs" / f"{role}-{index}.log",
                plugin_dir=plugin_dir,
                gpus=share.devices,
                cpu_bind=bind,
                memory_share=None if share.memory_share is None else memory_share(cell, share),
                start_stage=share.start_stage,
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


def memory_share(cell: Cell, share: GpuShare) -> float:
    """The memory share a server runs with: the one the model's or the sweep's serve args give
    (they override pdcheck's, and the arm's flags never set it), else pdcheck's, else vLLM's."""
    user = flag_value(user_serve_args(cell), GPU_MEMORY_FLAG)
    if user is None:
        return VLLM_DEFAULT_MEMORY_SHARE if share.memory_share is None else share.memory_share
    try:
        return float(user)
    except ValueError:
        raise ConfigError(
            f"{GPU_MEMORY_FLAG} {user!r} in {cell.name}'s serve args is not a number"
        ) from None


def check_memory_shares(cell: Cell, shares: dict[tuple[Role, int], GpuShare]) -> None:
    """`ConfigError` when the servers sharing a GPU ask for more than all of its memory: each
    checks at its start that its share is free, so the last one could never start."""
    on_gpu: dict[str, list[tuple[str, float]]] = {}
    for (role, index), share in shares.items():
        for device in share.devices:
            on_gpu.setdefault(device, []).append((f"{role}-{index}", memory_share(cell, share)))
    for device, servers in on_gpu.items():
        if len(servers) > 1 and sum(s for _, s in servers) > 1:
            asked = " + ".join(f"{name} {s:g}" for name, s in servers)
            raise ConfigError(
                f"{cell.name}: the servers sharing GPU {device} ask for {asked} of its memory, more "
                f"than all of it; vLLM starts a server only when its share is free. Drop "
                f"{GPU_MEMORY_FLAG} from the serve args (pdcheck then splits "
                f"{COLOCATED_MEMORY_BUDGET:g} between the servers sharing a GPU), or lower it"
            )
