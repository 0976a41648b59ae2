"""Placement groups for a Ray cluster: what each job's servers reserve, and whether it fits.

Pure, no Ray import: `--dry-run` prints these requests, and a sweep checks every one against
the cluster's nodes before anything starts. One bundle per server, in the order of
`Cell.servers(*roles)`: a GPU server reserves one GPU per TP rank (and one CPU for the actor
that owns it), a CPU server one CPU per rank. A baseline is a group of one bundle; a PD
topology's group is STRICT_PACK (`same-node`: one node) or STRICT_SPREAD (`cross-node`: a node
per server, so KV crosses the network between prefill and decode).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from pdcheck.config import Cell
from pdcheck.config.cells import Role
from pdcheck.config.schema import RayPlacement
from pdcheck.contracts import environment
from pdcheck.errors import GpuInventoryError
from pdcheck.serving.argv import Platform
from pdcheck.serving.plan import ServerPlan

STRATEGIES: dict[RayPlacement, str] = {"same-node": "STRICT_PACK", "cross-node": "STRICT_SPREAD"}


@dataclass(frozen=True)
class GroupRequest:
    """One placement group: a bundle of resources per server, and how Ray may spread them."""

    label: str
    strategy: str
    servers: tuple[str, ...]
    bundles: tuple[dict[str, float], ...]

    def render(self) -> str:
        parts = " | ".join(
            f"{name} {json.dumps(b, sort_keys=True)}"
            for name, b in zip(self.servers, self.bundles, strict=True)
        )
        return f"# ray placement group ({self.label}): {self.strategy} [{parts}]"


@dataclass(frozen=True)
class NodeResources:
    """A live node of the cluster and the resources it has in total."""

    node_id: str
    address: str
    total: Mapping[str, float]

    @property
    def label(self) -> str:
        return f"{self.address} ({self.node_id[:8]})"


def server_resources(cell: Cell, role: Role, *, platform: Platform) -> dict[str, float]:
    ranks = float(cell.tp(role))
    return {"CPU": 1.0, "GPU": ranks} if platform == "gpu" else {"CPU": ranks}


def group_request(
    cell: Cell, *, roles: Sequence[Role], placement: RayPlacement, platform: Platform
) -> GroupRequest:
    """The placement group of the servers of `roles` (a baseline, or a PD topology)."""
    servers = cell.servers(*roles)
    side = "baseline" if roles == ("baseline",) else "pd"
    return GroupRequest(
        label=f"{side} {cell.name}",
        strategy="STRICT_PACK" if side == "baseline" else STRATEGIES[placement],
        servers=tuple(f"{role}-{index}" for role, index in servers),
        bundles=tuple(server_resources(cell, role, platform=platform) for role, _ in servers),
    )


def _fits(bundle: Mapping[str, float], node: Mapping[str, float]) -> bool:
    return all(node.get(k, 0.0) >= v for k, v in bundle.items() if v > 0)


def _sum(bundles: Sequence[Mapping[str, float]]) -> dict[str, float]:
    total: dict[str, float] = {}
    for bundle in bundles:
        for key, value in bundle.items():
            total[key] = total.get(key, 0.0) + value
    return total


def _spread(bundles: Sequence[Mapping[str, float]], nodes: Sequence[Mapping[str, float]]) -> bool:
    """A distinct node for every bundle (a small matching, by backtracking)."""

    def assign(i: int, used: frozenset[int]) -> bool:
        if i == len(bundles):
            return True
        return any(
            assign(i + 1, used | {n})
            for n, node in enumerate(nodes)
            if n not in used and _fits(bundles[i], node)
        )

    return assign(0, frozenset())


def unplaceable(request: GroupRequest, nodes: Sequence[NodeResources]) -> str | None:
    """Why the group can never be placed on these nodes (even an idle cluster), or None."""
    totals = [n.total for n in nodes]
    if request.strategy == "STRICT_PACK":
        need = _sum(request.bundles)
        if any(_fits(need, node) for node in totals):
            return None
        return f"{request.label} needs {_fmt(need)} on one node"
    if _spread(request.bundles, totals):
        return None
    per_server = ", ".join(
        f"{name} {_fmt(b)}" for name, b in zip(request.servers, request.bundles, strict=True)
    )
    return f"{request.label} needs {len(request.bundles)} different nodes ({per_server})"


def check_placeable(requests: Sequence[GroupRequest], nodes: Sequence[NodeResources]) -> None:
    """`GpuInventoryError` naming every group that cannot be placed and what the cluster has."""
    problems = list(dict.fromkeys(p for r in requests if (p := unplaceable(r, nodes))))
    if not problems:
        return
    have = "; ".join(f"{n.label}: {_fmt(n.total)}" for n in nodes) or "no live nodes"
    raise GpuInventoryError(
        "the Ray cluster cannot place these topologies: "
        + "; ".join(problems)
        + f". The cluster has {len(nodes)} node(s): {have}. Add nodes or resources, exclude "
        "the cells, or use `placement: same-node` (ray section) / --ray-placement same-node."
    )


def _fmt(resources: Mapping[str, float]) -> str:
    shown = {k: v for k, v in sorted(resources.items()) if k in ("CPU", "GPU") and v}
    return ", ".join(f"{v:g} {k}" for k, v in shown.items()) or "nothing"


@dataclass(frozen=True)
class NodeSeat:
    """Where Ray put one server: its node, and the GPUs its actor was given there."""

    node_id: str
    address: str
    gpus: tuple[str, ...] = ()

    @property
    def label(self) -> str:
        return f"{self.address} ({self.node_id[:8]})"


def seat_server(server: ServerPlan, seat: NodeSeat) -> ServerPlan:
    """The planned server as it runs on its node: reached at the node's address (it listens
    where the cell says), advertising that address to NIXL peers, on the GPUs Ray gave it."""
    env = dict(server.env)
    if server.role != "baseline":
        env[environment.NIXL_SIDE_CHANNEL_HOST.name] = seat.address
    if "CUDA_VISIBLE_DEVICES" in env:
        env["CUDA_VISIBLE_DEVICES"] = ",".join(seat.gpus)
    return dataclasses.replace(server, host=seat.address, env=env, gpus=seat.gpus or server.gpus)
