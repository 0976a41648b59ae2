"""Block-boundary prompts: targets around k*B, prompts that hit them exactly, and coverage."""

from __future__ import annotations

import pytest

from pdcheck.config import EvalSettings
from pdcheck.config.schema import EdgePlan, EdgePrompt
from pdcheck.evals.dataset import Example, TaskData
from pdcheck.evals.edges import plan_edges, planned_coverage, served_coverage, targets
from pdcheck.evals.prompts import PromptBuilder, PromptOptions


def _words(text: str) -> int:
    """A stand-in tokenizer: one token per whitespace-separated word."""
    return len(text.split())


def _task() -> TaskData:
    # Questions of 4..9 words ("Question: ... Answer:" included); train shots of 5..11 words.
    test = tuple(Example(" ".join(["q"] * (2 + i % 6)), "#### 1") for i in range(40))
    train = tuple(
        Example(" ".join(["t"] * (1 + i % 5)), " ".join(["a"] * (i % 3)) + " #### 2")
        for i in range(60)
    )
    return TaskData(task="gsm8k", test=test, train=train, sha256="0" * 64, source="test")


def test_targets_bracket_each_boundary_and_hybrids_add_one():
    """k*B-1, k*B, k*B+1 at k = 1, 2, the window's own k, and a long k; a hybrid adds k*B+2
    (its prefiller sends N-1 tokens), and max-model-len cuts the long k."""
    plain = targets(16, hybrid=False, window_lengths=(40, 50), max_tokens_in=None)
    assert plain.by_k == {
        1: (15, 16, 17),
        2: (31, 32, 33),
        3: (47, 48, 49),
        8: (127, 128, 129),
    }
    hybrid = targets(16, hybrid=True, window_lengths=(40, 44), max_tokens_in=100)
    assert hybrid.held_back == 1
    assert hybrid.by_k[6] == (95, 96, 97, 98)
    assert 8 not in hybrid.by_k


def test_plan_hits_every_reachable_target_exactly_and_is_deterministic():
    """Each planned prompt, built as the runner builds it, has exactly its planned length; the
    plan only re-chooses shots of window questions and is the same on a second call."""
    task = _task()
    builder = PromptBuilder(task, PromptOptions(shots=3))
    plan = plan_edges(
        task, builder, range(30), _words, block_size=16, hybrid=False, max_tokens_in=None
    )
    again = plan_edges(
        task, builder, range(30), _words, block_size=16, hybrid=False, max_tokens_in=None
    )
    assert plan == again
    assert plan.prompts and all(p.index < 30 for p in plan.prompts)
    edged = PromptBuilder(
        task, PromptOptions.from_settings(EvalSettings(shots=3, edges=True, edge_plan=plan))
    )
    for p in plan.prompts:
        assert _words(edged.prompt(p.index)) == p.tokens
    served = [_words(edged.prompt(i)) for i in range(30)]
    assert served_coverage(plan, served) == planned_coverage(plan)
    assert planned_coverage(plan).missed == ()


def test_edge_prompt_keeps_question_and_changes_only_its_shots(small_task):
    """A boundary prompt asks its own question after the plan's train items; other questions
    keep the style's shots, and the prompt hash follows the prompt."""
    plan = EdgePlan(block_size=16, prompts=(EdgePrompt(index=2, shots=(3, 0), tokens=9),))
    settings = EvalSettings(shots=1, edges=True, edge_plan=plan)
    builder = PromptBuilder(small_task, PromptOptions.from_settings(settings))
    plain = PromptBuilder(small_task, PromptOptions(shots=1))
    assert builder.prompt(2) == (
        "Question: Train question 3?\nAnswer: It is 3.\n#### 3\n\n"
        "Question: Train question 0?\nAnswer: It is 0.\n#### 0\n\n"
        "Question: What is 2 + 2?\nAnswer:"
    )
    assert builder.prompt(1) == plain.prompt(1)
    assert builder.prompt_sha256(2) != plain.prompt_sha256(2)
    assert builder.prompt_sha256(1) == plain.prompt_sha256(1)


def test_coverage_line_names_hits_misses_and_blocks():
    plan = EdgePlan(block_size=32, held_back=1, targets=(31, 32, 33))
    text = served_coverage(plan, [32, 32, 100]).describe()
    assert text == (
        "block-boundary coverage (block size 32, the prefiller sends N-1 tokens (hybrid)): "
        "32×2; no prompt of 31, 33 tokens; prompts span 1-4 blocks"
    )


def test_edges_with_the_lmeval_engine_is_refused():
    """lm-eval builds its own prompts, so boundary shots cannot be chosen: refused at load."""
    with pytest.raises(ValueError, match="needs engine 'pdcheck'"):
        EvalSettings(edges=True, engine="lm-eval")


def test_a_target_out_of_reach_costs_a_bounded_number_of_counts():
    """A tokenizer under which no prompt can reach a target (every prompt far too long) gives up
    on each target after `MAX_COUNTS_PER_TARGET` whole counts, not a scan of the window."""
    from pdcheck.evals.edges import MAX_COUNTS_PER_TARGET

    task = _task()
    builder = PromptBuilder(task, PromptOptions(shots=3))
    calls = 0

    def lumpy(text: str) -> int:
        # Prompts count in tens, so no boundary target k*16 +- 1 is ever hit exactly.
        nonlocal calls
        calls += 1
        return 10 * len(text.split()) + 5

    plan = plan_edges(
        task, builder, range(30), lumpy, block_size=16, hybrid=False, max_tokens_in=None
    )
    # The window's own prompts, the join, each shot, each question, and the no-shot fallback.
    fixed = 30 + 3 + len(task.train) + 30 + 30
    assert plan.prompts == ()
    assert calls <= fixed + len(plan.targets) * MAX_COUNTS_PER_TARGET


def test_no_transformers_means_no_plan_with_the_reason(monkeypatch):
    """A base install (no vLLM, so no transformers) plans no boundary prompts and says why."""
    import sys

    from pdcheck.evals.edges import TokenizerMissing, token_counter

    monkeypatch.setitem(sys.modules, "transformers", None)
    with pytest.raises(TokenizerMissing, match="transformers is not installed"):
        token_counter("/nonexistent/model", EvalSettings())
