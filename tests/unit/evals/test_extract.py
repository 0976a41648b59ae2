"""Answer extraction matches vLLM's gsm8k_eval.py and lm-eval's gsm8k v3, on hand-checked examples."""

from __future__ import annotations

import ast

import pytest
from hypothesis import given
from hypothesis import strategies as st
from lm_eval.api.metrics import exact_match_hf_evaluate
from lm_eval.filters.extraction import RegexFilter

from pdcheck.evals.extract import (
    LMEVAL_INVALID,
    flexible_extract,
    gold_answer,
    lmeval_normalize,
    score,
    strict_match,
    vllm_answer,
)

# (completion, vLLM's get_answer_value result worked out by hand; None = its INVALID)
VLLM_CASES = [
    ("Janet makes 9 * 2 = $18 every day.\n#### 18", 18),
    ("The loss is -5 dollars", 5),  # \d+ has no sign: vLLM reads -5 as 5
    ("She earns 1,234,567 in total", 1234567),  # commas are stripped first
    ("It costs $3.75", 75),  # the last digit run of a decimal
    ("no number here", None),
    ("", None),
    ("The code is 007", None),  # ast.literal_eval rejects leading zeros
    ("0 apples", 0),
    ("00 apples", 0),  # all zeros is a valid literal
    ("\u0663 apples", None),  # an Arabic-Indic digit matches \d but is no Python literal
    ("first 12 then 30, then 4", 4),
]


@pytest.mark.parametrize(("text", "expected"), VLLM_CASES)
def test_vllm_answer_matches_hand_checked_values(text, expected):
    """vllm style: strip commas, last integer, literal_eval; no number (or unparsable) is invalid."""
    assert vllm_answer(text) == expected


def _their_value(digits: str):
    """vLLM's own parse of a digit run: ast.literal_eval, SyntaxError meaning invalid."""
    try:
        return ast.literal_eval(digits)
    except (SyntaxError, ValueError):
        return None


@given(st.from_regex(r"\d{1,30}", fullmatch=True))
def test_vllm_parse_equals_ast_literal_eval(digits):
    """pdcheck parses every digit run (any \\d, leading zeros) exactly as ast.literal_eval does."""
    assert vllm_answer(digits) == _their_value(digits)


LMEVAL_TEXTS = [
    "Natalia sold 48/2 = 24 clips.\n#### 72",
    "So the answer is #### -1,234.",
    "#### $1,000.50\nQuestion: more",
    "The total is $18.",
    "He has 5 apples and -3 pears",
    "no number here",
    "#### 3 and later #### 4",
    "7",
    "",
    "Total: 1.5.",
]


@pytest.mark.parametrize("text", LMEVAL_TEXTS)
def test_lmeval_filters_equal_lm_evals_own_regex_filters(text):
    """strict-match takes the first `#### N` and flexible-extract the last number, as lm-eval's RegexFilter does."""
    strict = RegexFilter(regex_pattern=r"#### (\-?[0-9\.\,]+)", group_select=0)
    flexible = RegexFilter(regex_pattern=r"(-?[$0-9.,]{2,})|(-?[0-9]+)", group_select=-1)
    assert strict_match(text) == next(iter(strict.apply([[text]], [{}])))[0]
    assert flexible_extract(text) == next(iter(flexible.apply([[text]], [{}])))[0]


def test_lmeval_filters_on_hand_checked_values():
    """The same filters, with values worked out by hand from the gsm8k v3 regexes."""
    assert strict_match("So the answer is #### -1,234.") == "-1,234."
    assert strict_match("#### 3 and later #### 4") == "3"
    assert strict_match("The total is $18.") == LMEVAL_INVALID
    assert flexible_extract("The total is $18.") == "$18."
    assert flexible_extract("He has 5 apples and -3 pears") == "-3"
    assert flexible_extract("7") == "7"
    assert flexible_extract("no number here") == LMEVAL_INVALID


@pytest.mark.parametrize(
    ("prediction", "reference"),
    [
        ("-1,234.", "work\n#### -1234"),
        ("$1,000", "x = 1000\n#### 1,000"),
        ("18", "Janet sells 16 - 3 - 4 = 9.\n#### 18"),
        ("18.", "#### 18"),
        ("1.50", "#### 1.5"),
        ("[invalid]", "#### 18"),
        ("ABC", "#### abc"),
    ],
)
def test_lmeval_exact_match_equals_lm_evals_metric(prediction, reference):
    """exact_match ignores case, `,`, `$`, everything up to `#### ` and a final `.`, as lm-eval's metric does."""
    ignore = [",", "\\$", "(?s).*#### ", "\\.$"]
    theirs = exact_match_hf_evaluate(
        [prediction], [reference], regexes_to_ignore=ignore, ignore_case=True
    )["exact_match"]
    assert (lmeval_normalize(prediction) == lmeval_normalize(reference)) == bool(theirs)


def test_score_vllm_style():
    """vllm style: correct when the last integer equals the reference's last integer; no number is invalid."""
    reference = "Janet sells 16 - 3 - 4 = <<16-3-4=9>>9 duck eggs.\n#### 18"
    assert gold_answer("vllm", reference) == "18"
    gold = gold_answer("vllm", reference)
    right = score("vllm", " She makes 9 * 2 = $18.", gold)
    assert (right.answer, right.correct, right.invalid) == ("18", True, False)
    wrong = score("vllm", " 9 eggs", gold)
    assert (wrong.answer, wrong.correct, wrong.invalid) == ("9", False, False)
    invalid = score("vllm", " I do not know", gold)
    assert (invalid.answer, invalid.correct, invalid.invalid) == (None, False, True)
    assert score("chat", "The answer is 18", gold_answer("chat", reference)).correct


def test_score_lmeval_style_uses_strict_match_and_keeps_both_answers():
    """lm-eval style: the main answer is strict-match; flexible-extract is kept beside it."""
    gold = gold_answer("lm-eval", "It takes 2/2=1 bolt.\n#### 3")
    s = score("lm-eval", " 2 + 1 = 3 bolts.\n#### 3", gold)
    assert (s.answer, s.correct, s.invalid) == ("3", True, False)
    assert s.answers == {"strict-match": "3", "flexible-extract": "3"}
    loose = score("lm-eval", " The total is 3 bolts.", gold)
    assert (loose.answer, loose.correct, loose.invalid) == (None, False, True)
    assert loose.answers["flexible-extract"] == "3"


def test_vllm_gold_equals_vllms_own_rule_on_all_of_gsm8k(gsm8k_dir):
    """The gold (read from the tail after '####' for speed) equals get_answer_value of the whole reference."""
    from pdcheck.config import EvalSettings
    from pdcheck.evals.dataset import load_task

    task = load_task(EvalSettings(dataset=gsm8k_dir))
    for example in task.test + task.train:
        assert gold_answer("vllm", example.answer) == str(vllm_answer(example.answer))
