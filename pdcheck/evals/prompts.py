"""Prompt styles: the exact prompts and request bodies of vLLM's and lm-eval's GSM8K harnesses.

- `vllm` (tests/evals/gsm8k/gsm8k_eval.py): the first `shots` train items, each as
  "Question: {q}\\nAnswer: {a}\\n\\n", then "Question: {q}\\nAnswer:"; greedy, seed 42, stop
  ["Question", "Assistant:", "<|separator|>"], /v1/completions.
- `lm-eval` (gsm8k v3 through local-completions): the same shot layout, but the shots are drawn
  per question by `random.Random(1234).sample(train, shots)`, one draw per test question in
  index order (lm-eval's ContextSampler with its default fewshot seed); stop ["Question:",
  "</s>", "<|im_end|>"], seed 1234.
- `chat`: the `vllm` prompt as one user message to /v1/chat/completions, optionally with
  `chat_template_kwargs`, and optionally without stop strings (thinking models write them).

Unlike vLLM's script, the `model` field is always sent: proxies route on it.

A block-boundary prompt (`eval.edges`, pdcheck/evals/edges.py) is its question asked after the
train items the plan chose in place of the style's shots, in the same layout.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from pdcheck.config import EvalSettings
from pdcheck.errors import ConfigError
from pdcheck.evals.dataset import Example, TaskData

VLLM_STOP = ("Question", "Assistant:", "<|separator|>")
LMEVAL_STOP = ("Question:", "</s>", "<|im_end|>")
VLLM_SEED = 42
LMEVAL_SEED = 1234
LMEVAL_FEWSHOT_SEED = 1234
COMPLETIONS_PATH = "/v1/completions"
CHAT_PATH = "/v1/chat/completions"
TOP_LOGPROBS = 2


@dataclass(frozen=True)
class PromptOptions:
    """Everything that shapes a request body; `stop=False` drops stop strings (thinking models)."""

    style: str = "vllm"
    shots: int = 5
    max_tokens: int = 256
    logprobs: bool = False
    chat_template_kwargs: dict[str, Any] | None = None
    stop: bool = True
    # vLLM's extensions: generated token ids, and logprob tokens as "token_id:N"; other servers
    # may refuse these fields (the runner's preflight then turns this off).
    token_ids: bool = True
    # Test index -> the train items its block-boundary prompt is asked after (eval.edge_plan).
    edge_shots: dict[int, tuple[int, ...]] = field(default_factory=dict)

    @classmethod
    def from_settings(cls, settings: EvalSettings) -> PromptOptions:
        return cls(
            style=settings.style,
            shots=settings.shots,
            max_tokens=settings.max_tokens,
            logprobs=settings.logprobs,
            chat_template_kwargs=settings.chat_template_kwargs,
            stop=not settings.no_stop,
            edge_shots={p.index: p.shots for p in settings.edge_plan.prompts}
            if settings.edge_plan
            else {},
        )

    @property
    def path(self) -> str:
        return CHAT_PATH if self.style == "chat" else COMPLETIONS_PATH


def format_shot(example: Example) -> str:
    """One solved example, as both harnesses write it."""
    return f"Question: {example.question}\nAnswer: {example.answer}\n\n"


def format_question(example: Example) -> str:
    return f"Question: {example.question}\nAnswer:"


def shots_text(task: TaskData, train_indices: Sequence[int]) -> str:
    """The few-shot text of these train items, in order."""
    return "".join(format_shot(task.train[i]) for i in train_indices)


def lmeval_shot_indices(
    n_train: int, *, shots: int, count: int, seed: int = LMEVAL_FEWSHOT_SEED
) -> list[list[int]]:
    """The train indices lm-eval's default sampler picks for test questions 0..count-1, in order."""
    rng = random.Random(seed)
    population = range(n_train)
    return [rng.sample(population, shots) for _ in range(count)]


class PromptBuilder:
    """Builds the prompt and request body for any test index of a task, in one style."""

    def __init__(self, task: TaskData, options: PromptOptions):
        if options.shots > len(task.train):
            raise ConfigError(
                f"{options.shots} shots need {options.shots} train items; {task.task} has {len(task.train)}"
            )
        self.task = task
        self.options = options
        self._shared_prefix = "".join(format_shot(ex) for ex in task.train[: options.shots])
        self._shots_shared = options.style != "lm-eval" or options.shots == 0
        self._shared_prefix_hash = hashlib.sha256(self._shared_prefix.encode())
        self._lmeval_shots: list[list[int]] = []

    def _shots_for(self, index: int) -> str:
        edge = self.options.edge_shots.get(index)
        if edge is not None:
            return shots_text(self.task, edge)
        if self._shots_shared:
            return self._shared_prefix
        if index >= len(self._lmeval_shots):
            self._lmeval_shots = lmeval_shot_indices(
                len(self.task.train),
                shots=self.options.shots,
                count=max(index + 1, len(self.task.test)),
            )
        return shots_text(self.task, self._lmeval_shots[index])

    def prompt(self, index: int) -> str:
        """The full prompt text for test question `index` (the chat style sends it as one user message)."""
        return self._shots_for(index) + format_question(self.task.test[index])

    def prompt_sha256(self, index: int) -> str:
        """`prompt_sha256(self.prompt(index))`; shots every question shares are hashed once, not per question."""
        if not self._shots_shared or index in self.options.edge_shots:
            return prompt_sha256(self.prompt(index))
        digest = self._shared_prefix_hash.copy()
        digest.update(format_question(self.task.test[index]).encode())
        return digest.hexdigest()

    def body(self, prompt: str, *, model: str, max_tokens: int | None = None) -> dict[str, Any]:
        """The JSON body that sends `prompt`; `max_tokens` overrides the option (the preflight uses 1)."""
        opts = self.options
        body: dict[str, Any] = {
            "model": model,
            "max_tokens": max_tokens or opts.max_tokens,
            "temperature": 0.0,
        }
        if opts.style == "chat":
            body["messages"] = [{"role": "user", "content": prompt}]
            if opts.chat_template_kwargs:
                body["chat_template_kwargs"] = opts.chat_template_kwargs
            if opts.logprobs:
                body["logprobs"] = True
                body["top_logprobs"] = TOP_LOGPROBS
        else:
            body["prompt"] = prompt
            if opts.logprobs:
                body["logprobs"] = TOP_LOGPROBS
                if opts.token_ids:
                    # Completions key top_logprobs by token text; distinct tokens that decode alike
                    # (byte pieces) collide and lose the runner-up. "token_id:N" keys cannot collide.
                    body["return_tokens_as_token_ids"] = True
        if opts.stop:
            body["stop"] = list(LMEVAL_STOP if opts.style == "lm-eval" else VLLM_STOP)
        body["seed"] = LMEVAL_SEED if opts.style == "lm-eval" else VLLM_SEED
        if opts.token_ids:
            body["return_token_ids"] = True
        return body


def prompt_sha256(prompt: str) -> str:
    return hashlib.sha256(prompt.encode()).hexdigest()
