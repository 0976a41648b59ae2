"""What pdcheck's `_vllm` programs, run by serving in the servers' python, are asked and answer.

`python -m pdcheck._vllm.fixes` prints `FIXES_PREFIX` then JSON: `{"fixes": {fix:
FixStatus.to_dict()}, "error": str or null}` (pdcheck.contracts.fixes).

`python -m pdcheck._vllm.import_env` prints `IMPORT_ENV_PREFIX` then JSON: the variables
importing vLLM's CLI read, set and removed (`{"read": [...], "set": {...}, "removed": [...],
"error": str or null}`).

`python -m pdcheck._vllm.serve_check`: serving sends, on the program's standard input, the `vllm serve` arguments of each server with
the whole environment it will run in; the program answers one line, `RESULT_PREFIX` then JSON:
per server, the problems vLLM's own parser and validation found, and, where the engine config
was built, what vLLM decided in building it (`EngineDecisions`). Every value there is vLLM's.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field

RESULT_PREFIX = "PDCHECK-SERVE-CHECK "
FIXES_PREFIX = "PDCHECK-FIXES "
IMPORT_ENV_PREFIX = "PDCHECK-IMPORT-ENV "


@dataclass(frozen=True)
class ServerToCheck:
    """One server: the arguments after `serve`, and its whole environment (None: the program's own)."""

    args: list[str]
    env: dict[str, str] | None = None


@dataclass(frozen=True)
class ServeCheckRequest:
    servers: list[ServerToCheck]
    # Build the engine config as `vllm serve` does, not only parse.
    build_config: bool = False
    # The device type the servers will run on ("cuda", "cpu"); a build on another platform
    # would answer for the wrong machine, so it is not attempted.
    device_type: str | None = None

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> ServeCheckRequest:
        raw = json.loads(text)
        return cls(
            servers=[ServerToCheck(**s) for s in raw["servers"]],
            build_config=raw["build_config"],
            device_type=raw["device_type"],
        )


@dataclass(frozen=True)
class EngineDecisions:
    """What vLLM's `create_engine_config()` and `vllm serve`'s set-up decided for one server."""

    device_type: str
    model_runner: str  # "v1" or "v2"
    executor_backend: str  # "uni", "mp", ...
    executor: str  # the executor class vLLM will start
    async_scheduling: bool
    # How the API server starts its EngineCore, after `cli_env_setup` and the platform's hook.
    start_method: str
    # The Mamba conv-state layout a hybrid model gets ("SD", "DS"); None for other models.
    conv_state_layout: str | None
    kv_connector: str | None
    kv_role: str | None
    max_model_len: int
    hybrid_kv_cache_manager: bool


@dataclass(frozen=True)
class ServeCheck:
    """One server's answer: problems ([] when vLLM accepts it), and the decisions when built."""

    problems: list[str] = field(default_factory=list)
    decisions: EngineDecisions | None = None
    # Why the engine config was not built when it was asked for (no problem with the server).
    not_built: str | None = None

    @classmethod
    def from_dict(cls, raw: dict) -> ServeCheck:
        decisions = raw.get("decisions")
        return cls(
            problems=list(raw["problems"]),
            decisions=EngineDecisions(**decisions) if decisions else None,
            not_built=raw.get("not_built"),
        )


def render_result(checks: list[ServeCheck]) -> str:
    return RESULT_PREFIX + json.dumps([asdict(c) for c in checks])


def parse_result(stdout: str) -> list[ServeCheck] | None:
    """The program's answer in its standard output; None when it printed none."""
    for line in stdout.splitlines():
        if line.startswith(RESULT_PREFIX):
            return [ServeCheck.from_dict(c) for c in json.loads(line.removeprefix(RESULT_PREFIX))]
    return None
