"""Block-boundary prompts: a cell's questions include prompts that end on its block boundaries.

A KV transfer moves ceil(N / B) blocks for an N-token prompt at block size B; an off-by-one in
that count, or in which block is the partly filled last one, acts only when N lands at k*B-1,
k*B or k*B+1. GSM8K's 5-shot prompts are all about the same length (gsm8k-synth's are 287-299
tokens for the tiny models), so with B = 128 none of them ends on a boundary. `plan_edges`
picks, by the model's own tokenizer, prompts for the targets k*B-1, k*B, k*B+1 (and k*B+2 for a
Mamba/GDN hybrid, whose prefiller sends N-1 tokens) at k = 1, 2 and one k of many blocks.

How a target is reached, and why the scoring stays honest: a window question whose own prompt
(the style's shots) already has the target length counts as is. Otherwise some window question
is asked after other GSM8K train items in place of the style's shots: the style's first train
items extended in order (so the prompt keeps the shared few-shot prefix, and with prefix
caching a decoder's partial read spans many blocks), then one more train item whose length
closes the gap. The question, its gold answer, the layout and the scoring are GSM8K's; only
which solved examples precede it changes, and the baseline and PD sides ask the same prompt.
The first window question (in index order) that reaches a target gets it, so the boundary
prompts come early and are asked before an early stop's first look.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from pdcheck.config import EvalSettings
from pdcheck.config.paths import resolve_model_path
from pdcheck.config.schema import EdgePlan, EdgePrompt
from pdcheck.evals.dataset import TaskData
from pdcheck.evals.prompts import PromptBuilder, format_question, shots_text

# Token count of a prompt as the server will see it (the model's tokenizer, special tokens in).
CountTokens = Callable[[str], int]

# The long prompt spans at least this many blocks, and two more than the longest window prompt.
MIN_LONG_BLOCKS = 8
# How many of the style's leading shots a boundary prompt may drop to make room for its gap item.
MAX_DROPPED_SHOTS = 3
# How many whole prompts one target may count before the plan goes without it. Every dry run
# plans every cell, and at GPU block size 16 a cell has dozens of targets: a scan of the whole
# window for one out of reach took minutes (500 questions, about 40 counts each).
MAX_COUNTS_PER_TARGET = 48


@dataclass(frozen=True)
class Targets:
    """The token counts a cell's prompts should hit, grouped by block count k."""

    block_size: int
    held_back: int
    by_k: dict[int, tuple[int, ...]]

    @property
    def all(self) -> tuple[int, ...]:
        return tuple(t for ts in self.by_k.values() for t in ts)


def targets(
    block_size: int,
    *,
    hybrid: bool,
    window_lengths: tuple[int, int],
    max_tokens_in: int | None,
) -> Targets:
    """k*B-1, k*B, k*B+1 (and k*B+2 for a hybrid) for k = 1, 2, every k whose boundary lies
    within the window's own prompt lengths, and a long k: at least `MIN_LONG_BLOCKS` and two
    blocks past the longest window prompt, cut to fit `max_tokens_in` (what max-model-len leaves
    after the completion)."""
    offsets = (-1, 0, 1, 2) if hybrid else (-1, 0, 1)
    lo, hi = window_lengths
    long_k = max(MIN_LONG_BLOCKS, math.ceil(hi / block_size) + 2)
    if max_tokens_in is not None:
        long_k = min(long_k, (max_tokens_in - max(offsets)) // block_size)
    inside = range(math.ceil((lo + 1) / block_size), (hi + 1) // block_size + 1)
    ks = sorted({k for k in (1, 2, *inside, long_k) if k >= 1})
    return Targets(
        block_size,
        1 if hybrid else 0,
        {k: tuple(k * block_size + d for d in offsets if k * block_size + d > 0) for k in ks},
    )


def plan_edges(
    task: TaskData,
    builder: PromptBuilder,
    window: Sequence[int],
    count: CountTokens,
    *,
    block_size: int,
    hybrid: bool,
    max_tokens_in: int | None,
) -> EdgePlan:
    """The boundary prompts for the questions `window` asks (deterministic: same inputs, same plan)."""
    natural = {i: count(builder.prompt(i)) for i in window}
    goal = targets(
        block_size,
        hybrid=hybrid,
        window_lengths=(min(natural.values()), max(natural.values())),
        max_tokens_in=max_tokens_in,
    )
    # Tokens do not add up across a join (a shot's closing blank line merges with what follows),
    # so each shot is costed as its own count plus the join's, measured once; `_reach` counts
    # each candidate whole.
    first = window[0]
    join = (
        count(shots_text(task, (0,)) + format_question(task.test[first]))
        - count(shots_text(task, (0,)))
        - count(format_question(task.test[first]))
    )
    shot_len = [count(shots_text(task, (i,))) + join for i in range(len(task.train))]
    question_len = {i: count(format_question(task.test[i])) for i in window}
    taken: set[int] = set()
    prompts: list[EdgePrompt] = []
    for target in goal.all:
        if target in natural.values():
            continue
        found = _reach(target, task, window, taken, count, shot_len, question_len)
        if found is not None:
            taken.add(found.index)
            prompts.append(found)
    # Where no target of 1 or 2 blocks is reachable (B below the shortest prompt with a shot),
    # a question asked with no shots still gives a prompt of that many blocks, if one fits.
    spans = {math.ceil(n / block_size) for n in (*natural.values(), *(p.tokens for p in prompts))}
    for k in (1, 2):
        if k in spans:
            continue
        for index in window:
            tokens = count(format_question(task.test[index]))
            if index not in taken and math.ceil(tokens / block_size) == k:
                taken.add(index)
                prompts.append(EdgePrompt(index=index, shots=(), tokens=tokens))
                break
    edge_tokens = {p.index: p.tokens for p in prompts}
    planned = coverage(
        block_size, goal.held_back, goal.all, [edge_tokens.get(i, n) for i, n in natural.items()]
    )
    return EdgePlan(
        block_size=block_size,
        held_back=goal.held_back,
        prompts=tuple(sorted(prompts, key=lambda p: p.index)),
        targets=goal.all,
        planned_hits=tuple(planned.hits[t] for t in goal.all),
        planned_blocks=planned.blocks,
    )


def _reach(
    target: int,
    task: TaskData,
    window: Sequence[int],
    taken: set[int],
    count: CountTokens,
    shot_len: list[int],
    question_len: dict[int, int],
) -> EdgePrompt | None:
    """The first window question that, after train[0:s] plus at most one more train item,
    is exactly `target` tokens; lengths add up only roughly, so each candidate is counted whole,
    at most `MAX_COUNTS_PER_TARGET` of them."""
    prefix = [0]
    for n in shot_len:
        prefix.append(prefix[-1] + n)
    budget = MAX_COUNTS_PER_TARGET
    for index in window:
        if index in taken:
            continue
        room = target - question_len[index]
        if room < 0:
            continue
        question = format_question(task.test[index])
        # The most leading shots that fit, then a few fewer, each closed by one gap item.
        s_max = max(s for s in range(len(prefix)) if prefix[s] <= room)
        for s in range(s_max, max(-1, s_max - MAX_DROPPED_SHOTS - 1), -1):
            if budget <= 0:
                return None
            budget -= 1
            base = count(shots_text(task, range(s)) + question)
            gap = target - base
            if gap == 0:
                return EdgePrompt(index=index, shots=tuple(range(s)), tokens=base)
            for extra in _gap_items(gap, shot_len, start=s)[:budget]:
                budget -= 1
                shots = (*range(s), *extra)
                tokens = count(shots_text(task, shots) + question)
                if tokens == target:
                    return EdgePrompt(index=index, shots=shots, tokens=tokens)
    return None


def _gap_items(gap: int, shot_len: list[int], *, start: int) -> list[tuple[int, ...]]:
    """A few sets of one or two train items from `start` on whose estimated lengths close `gap`
    (within a token: the estimate is rough), the closest first."""
    by_len: dict[int, list[int]] = {}
    for r in range(start, len(shot_len)):
        by_len.setdefault(shot_len[r], []).append(r)
    found: list[tuple[int, tuple[int, ...]]] = []
    for miss in (0, 1, -1):
        found += [(abs(miss), (r,)) for r in by_len.get(gap + miss, [])[:2]]
        for n, firsts in by_len.items():
            seconds = [r for r in by_len.get(gap + miss - n, []) if r > firsts[0]]
            if seconds:
                found.append((abs(miss) + 1, (firsts[0], seconds[0])))
    return [items for _, items in sorted(found)[:8]]


@dataclass(frozen=True)
class Coverage:
    """Which boundary targets a cell's prompts hit, from their token counts."""

    block_size: int
    held_back: int
    hits: dict[int, int]  # target -> prompts of that length
    missed: tuple[int, ...]
    blocks: tuple[int, int]  # fewest and most blocks a prompt spans

    def describe(self) -> str:
        held = ", the prefiller sends N-1 tokens (hybrid)" if self.held_back else ""
        hit = ", ".join(f"{t}×{n}" for t, n in sorted(self.hits.items()) if n)
        missed = f"; no prompt of {', '.join(map(str, self.missed))} tokens" if self.missed else ""
        lo, hi = self.blocks
        return (
            f"block-boundary coverage (block size {self.block_size}{held}): "
            f"{hit or 'no target hit'}{missed}; prompts span {lo}-{hi} blocks"
        )


def coverage(
    block_size: int, held_back: int, goal: Sequence[int], prompt_tokens: Sequence[int]
) -> Coverage:
    """The coverage of prompts with these token counts against the targets `goal`."""
    hits = {t: sum(1 for n in prompt_tokens if n == t) for t in goal}
    spans = [math.ceil(n / block_size) for n in prompt_tokens] or [0]
    return Coverage(
        block_size=block_size,
        held_back=held_back,
        hits=hits,
        missed=tuple(t for t, n in hits.items() if n == 0),
        blocks=(min(spans), max(spans)),
    )


def served_coverage(plan: EdgePlan, prompt_tokens: Sequence[int]) -> Coverage:
    """The coverage of the prompts a server really counted (its records' prompt_tokens)."""
    return coverage(plan.block_size, plan.held_back, plan.targets, prompt_tokens)


def planned_coverage(plan: EdgePlan) -> Coverage:
    """The coverage the plan expects, by the tokenizer at plan time."""
    hits = dict(zip(plan.targets, plan.planned_hits, strict=True))
    return Coverage(
        block_size=plan.block_size,
        held_back=plan.held_back,
        hits=hits,
        missed=tuple(t for t, n in hits.items() if n == 0),
        blocks=plan.planned_blocks,
    )


class TokenizerMissing(Exception):
    """The model's tokenizer cannot be loaded from this machine (HF_HUB_OFFLINE, no cache)."""

    @classmethod
    def of(cls, error: Exception) -> TokenizerMissing:
        """`error` by its type and first line (transformers' and the Hub's run to paragraphs)."""
        first_line = (str(error).strip().splitlines() or [""])[0]
        return cls(f"{type(error).__name__}: {first_line}")


def token_counter(model_path: str, settings: EvalSettings) -> CountTokens:
    """Counts a prompt's tokens as the server will: the tokenizer of `model_path` (local files
    only), with its special tokens, and for the chat style through the chat template."""
    try:
        from transformers import AutoTokenizer
    except ImportError as exc:
        # A base install (no vLLM) still plans and dry-runs a sweep.
        raise TokenizerMissing(f"transformers is not installed ({exc})") from exc
    try:
        tokenizer = AutoTokenizer.from_pretrained(
            resolve_model_path(model_path), local_files_only=True
        )
    except (OSError, ValueError) as exc:
        raise TokenizerMissing.of(exc) from exc
    if not tokenizer("The answer is 42.")["input_ids"]:
        # A Hugging Face cache with a model's config but not its tokenizer files gives a
        # tokenizer without a vocabulary, which counts every prompt as 0 tokens.
        raise TokenizerMissing(f"the tokenizer of {model_path} has no vocabulary here")
    if settings.style == "chat":
        kwargs = settings.chat_template_kwargs or {}

        def chat(prompt: str) -> int:
            ids = tokenizer.apply_chat_template(
                [{"role": "user", "content": prompt}],
                add_generation_prompt=True,
                tokenize=True,
                **kwargs,
            )
            return len(ids["input_ids"] if isinstance(ids, dict) else ids)

        return chat
    return lambda prompt: len(tokenizer(prompt)["input_ids"])
