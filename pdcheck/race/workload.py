"""Workload definitions for the race harness: named variants and the per-seed request generator.

A workload is data (a frozen dataclass) checked at construction, so a bad definition fails
before any scheduler is built, with the fix in the message. Generation is a pure function of
the rng passed in: the same seed gives the same requests.
"""

from __future__ import annotations

import dataclasses
import random
from typing import Any

from pdcheck._vllm.sim_scheduler import SchedulerSpec
from pdcheck.errors import ConfigError

EOS_TOKEN = 0
VOCAB = 2048


@dataclasses.dataclass(frozen=True)
class Workload:
    """What one seed runs: the scheduler to build and the traffic to drive through it."""

    name: str
    scheduler: SchedulerSpec
    requests: int = 300
    remote_fraction: float = (
        0.5  # requests whose prompt KV a prefiller sends (loaded by the connector)
    )
    eos_fraction: float = 0.5  # requests that stop on EOS before max_tokens
    abort_rate: float = 0.0  # chance per step that one live request is aborted
    load_failure_rate: float = 0.0  # chance that a load fails (half whole, half partial)
    prompt_tokens: tuple[int, int] = (8, 160)
    max_tokens: tuple[int, int] = (2, 24)
    shared_prefix_fraction: float = 0.3  # prompts that start with one of a few shared prefixes
    prefix_families: int = 4
    load_latency_steps: int = 2  # a load is reported up to this many steps after its own step
    max_steps: int = 20000

    def __post_init__(self) -> None:
        for field in (
            "remote_fraction",
            "eos_fraction",
            "abort_rate",
            "load_failure_rate",
            "shared_prefix_fraction",
        ):
            value = getattr(self, field)
            if not 0.0 <= value <= 1.0:
                raise ConfigError(f"workload {self.name!r}: {field}={value} is outside [0, 1]")
        longest = self.prompt_tokens[1] + self.max_tokens[1] + self.scheduler.depth + 1
        if longest > self.scheduler.max_model_len:
            raise ConfigError(
                f"workload {self.name!r}: prompts up to {self.prompt_tokens[1]} plus {self.max_tokens[1]} output tokens "
                f"exceed max_model_len={self.scheduler.max_model_len}; lower prompt_tokens/max_tokens or raise max_model_len"
            )
        if self.requests < 1 or self.prompt_tokens[0] < 2 or self.max_tokens[0] < 1:
            raise ConfigError(
                f"workload {self.name!r}: needs requests >= 1, prompts >= 2 tokens and max_tokens >= 1"
            )
        if self.scheduler.depth < 1:
            raise ConfigError(
                f"workload {self.name!r}: depth must be >= 1 (1 is synchronous scheduling)"
            )

    def with_overrides(self, **changes: Any) -> Workload:
        scheduler_changes = {k: v for k, v in changes.items() if k in _SCHEDULER_FIELDS}
        own = {k: v for k, v in changes.items() if k not in _SCHEDULER_FIELDS}
        return dataclasses.replace(
            self, scheduler=dataclasses.replace(self.scheduler, **scheduler_changes), **own
        )


_SCHEDULER_FIELDS = {f.name for f in dataclasses.fields(SchedulerSpec)}


@dataclasses.dataclass(frozen=True, slots=True)
class SimRequest:
    """One generated request: its full token sequence (prompt then outputs) and how it ends."""

    request_id: str
    prompt_len: int
    tokens: tuple[int, ...]  # prompt + outputs + slack for steps still in flight after the end
    max_tokens: int
    remote: bool


def generate_requests(workload: Workload, rng: random.Random) -> list[SimRequest]:
    """The requests of one seed, in arrival order."""
    prefixes = [
        [
            rng.randrange(1, VOCAB)
            for _ in range(rng.randint(16, workload.prompt_tokens[1] // 2 + 16))
        ]
        for _ in range(workload.prefix_families)
    ]
    out = []
    for i in range(workload.requests):
        prompt_len = rng.randint(*workload.prompt_tokens)
        prompt: list[int] = []
        if prefixes and rng.random() < workload.shared_prefix_fraction:
            prompt = list(rng.choice(prefixes)[: prompt_len - 1])
        prompt += [rng.randrange(1, VOCAB) for _ in range(prompt_len - len(prompt))]
        max_tokens = rng.randint(*workload.max_tokens)
        outputs = [
            rng.randrange(1, VOCAB) for _ in range(max_tokens + workload.scheduler.depth + 1)
        ]
        if rng.random() < workload.eos_fraction:
            outputs[rng.randrange(max_tokens)] = EOS_TOKEN
        out.append(
            SimRequest(
                request_id=f"r{i:05d}",
                prompt_len=prompt_len,
                tokens=tuple(prompt + outputs),
                max_tokens=max_tokens,
                remote=rng.random() < workload.remote_fraction,
            )
        )
    return out


def _hybrid(mode: str, groups: int = 1, **kw: Any) -> SchedulerSpec:
    return SchedulerSpec(
        layout="hybrid",
        mamba_mode=mode,
        num_mamba_groups=groups,
        prefix_caching=mode == "align",
        **kw,
    )


VARIANTS: dict[str, Workload] = {
    w.name: w
    for w in (
        Workload("attention", SchedulerSpec()),
        Workload("attention-zeroing", SchedulerSpec(zeroing=True), load_failure_rate=0.2),
        Workload("hybrid-align", _hybrid("align")),
        Workload("hybrid-align-3mamba", _hybrid("align", 3)),
        Workload("hybrid-none", _hybrid("none", 3)),
        Workload("pp3", SchedulerSpec(depth=3, num_blocks=40)),
        Workload("pp3-aborts", SchedulerSpec(depth=3, num_blocks=40), abort_rate=0.1),
        Workload("aborts", _hybrid("align"), abort_rate=0.1),
        Workload("load-failures", SchedulerSpec(zeroing=True), load_failure_rate=0.3),
        Workload(
            "load-failures-fail",
            SchedulerSpec(zeroing=True, load_failure_policy="fail"),
            load_failure_rate=0.3,
        ),
        Workload("hybrid-load-failures", _hybrid("align"), load_failure_rate=0.3),
    )
}
DEFAULT_VARIANTS = ("attention", "hybrid-align")


def get_variant(name: str) -> Workload:
    try:
        return VARIANTS[name]
    except KeyError:
        raise ConfigError(
            f"unknown race variant {name!r}; allowed: {', '.join(VARIANTS)}"
        ) from None
