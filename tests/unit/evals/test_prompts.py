"""Prompts and request bodies are exactly the harnesses' (vLLM gsm8k_eval.py, lm-eval gsm8k v3)."""

from __future__ import annotations

import random

import pytest

from pdcheck.config import EvalSettings
from pdcheck.evals.prompts import PromptBuilder, PromptOptions, lmeval_shot_indices


def test_vllm_prompt_is_first_train_items_then_the_question(small_task):
    """vllm style: the first k train items as 'Question: q\\nAnswer: a\\n\\n', then 'Question: q\\nAnswer:'."""
    prompt = PromptBuilder(small_task, PromptOptions(style="vllm", shots=2)).prompt(3)
    assert prompt == (
        "Question: Train question 0?\nAnswer: It is 0.\n#### 0\n\n"
        "Question: Train question 1?\nAnswer: It is 1.\n#### 1\n\n"
        "Question: What is 3 + 3?\nAnswer:"
    )


def test_zero_shots_is_the_bare_question(small_task):
    """With shots=0 the prompt is only the question, in both styles."""
    for style in ("vllm", "lm-eval"):
        assert (
            PromptBuilder(small_task, PromptOptions(style=style, shots=0)).prompt(1)
            == "Question: What is 1 + 1?\nAnswer:"
        )


def test_lmeval_shots_follow_lm_evals_seeded_sampler(small_task):
    """lm-eval style: question i gets the i-th draw of random.Random(1234).sample(train, k)."""
    rng = random.Random(1234)
    draws = [rng.sample(range(len(small_task.train)), 3) for _ in range(len(small_task.test))]
    assert lmeval_shot_indices(len(small_task.train), shots=3, count=len(small_task.test)) == draws
    builder = PromptBuilder(small_task, PromptOptions(style="lm-eval", shots=3))
    for index in (4, 0, 5):  # any order: the draw depends on the index only
        expected = "".join(
            f"Question: {small_task.train[j].question}\nAnswer: {small_task.train[j].answer}\n\n"
            for j in draws[index]
        )
        assert (
            builder.prompt(index)
            == expected + f"Question: {small_task.test[index].question}\nAnswer:"
        )


def test_vllm_body(small_task):
    """vllm style body: model always sent, greedy, seed 42, vLLM's stop strings, 256 tokens, token ids asked."""
    builder = PromptBuilder(small_task, PromptOptions.from_settings(EvalSettings()))
    assert builder.body("P", model="m") == {
        "model": "m",
        "max_tokens": 256,
        "temperature": 0.0,
        "prompt": "P",
        "stop": ["Question", "Assistant:", "<|separator|>"],
        "seed": 42,
        "return_token_ids": True,
    }


def test_lmeval_body_matches_local_completions_payload(small_task):
    """lm-eval style body: the stop strings and seed lm-eval's local-completions sends."""
    body = PromptBuilder(small_task, PromptOptions(style="lm-eval")).body(
        "P", model="m", max_tokens=1
    )
    assert body["stop"] == ["Question:", "</s>", "<|im_end|>"]
    assert body["seed"] == 1234
    assert body["max_tokens"] == 1


def test_logprobs_ask_for_top2(small_task):
    """--logprobs asks for the top-2 per generated token, in each endpoint's own way."""
    completions = PromptBuilder(small_task, PromptOptions(logprobs=True)).body("P", model="m")
    assert completions["logprobs"] == 2
    assert completions["return_tokens_as_token_ids"] is True, (
        "token-id keys: alternatives cannot collide"
    )
    plain = PromptBuilder(small_task, PromptOptions(logprobs=True, token_ids=False)).body(
        "P", model="m"
    )
    assert "return_tokens_as_token_ids" not in plain and "return_token_ids" not in plain
    chat = PromptBuilder(small_task, PromptOptions(style="chat", logprobs=True)).body(
        "P", model="m"
    )
    assert (chat["logprobs"], chat["top_logprobs"]) == (True, 2)


def test_chat_body_sends_one_user_message_with_options(small_task):
    """chat style: the vllm prompt as one user message; chat_template_kwargs passed; stop can be dropped."""
    opts = PromptOptions(style="chat", chat_template_kwargs={"enable_thinking": False}, stop=False)
    builder = PromptBuilder(small_task, opts)
    body = builder.body(builder.prompt(0), model="m")
    assert opts.path == "/v1/chat/completions"
    assert body["messages"] == [
        {"role": "user", "content": PromptBuilder(small_task, PromptOptions()).prompt(0)}
    ]
    assert body["chat_template_kwargs"] == {"enable_thinking": False}
    assert "stop" not in body and "prompt" not in body
    assert body["model"] == "m"


def test_more_shots_than_train_items_is_an_error(small_task):
    """A prompt cannot have more shots than the train split holds."""
    with pytest.raises(ValueError, match="shots"):
        PromptBuilder(small_task, PromptOptions(shots=9))


@pytest.mark.parametrize(
    ("style", "shots"), [("vllm", 5), ("vllm", 0), ("chat", 3), ("lm-eval", 3), ("lm-eval", 0)]
)
def test_prompt_sha256_is_the_hash_of_the_whole_prompt(small_task, style, shots):
    """The builder's digest (shared shots hashed once) is sha256 of the full prompt, for every question."""
    import hashlib

    builder = PromptBuilder(
        small_task, PromptOptions(style=style, shots=min(shots, len(small_task.train)))
    )
    for index in range(len(small_task.test)):
        assert (
            builder.prompt_sha256(index)
            == hashlib.sha256(builder.prompt(index).encode()).hexdigest()
        )
