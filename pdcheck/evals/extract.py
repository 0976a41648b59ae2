"""Answer extraction and scoring, exactly as vLLM's and lm-eval's GSM8K harnesses do it.

`vllm` (and `chat`): vLLM's tests/evals/gsm8k/gsm8k_eval.py strips commas, takes the last run
of digits and parses it as `ast.literal_eval` would (so `-5` reads as 5, `3.75` as 75, and `007`
fails to parse and is invalid); no number is invalid. The gold is the same function applied to
the reference answer.

`lm-eval`: lm-eval's gsm8k v3 filters: `strict-match` takes the first `#### N`, and
`flexible-extract` the last number-like run; no match gives "[invalid]". `exact_match`
compares after deleting `,`, `$`, everything up to `#### ` and a final `.`, ignoring case.
The record's main answer is strict-match, the number vLLM's PD accuracy gate reads.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

LMEVAL_INVALID = "[invalid]"
_VLLM_NUMBER = re.compile(r"\d+")
_STRICT = re.compile(r"#### (\-?[0-9\.\,]+)")
_FLEXIBLE = re.compile(r"(-?[$0-9.,]{2,})|(-?[0-9]+)")
_LMEVAL_IGNORED = tuple(re.compile(p) for p in (",", r"\$", r"(?s).*#### ", r"\.$"))
STRICT_MATCH = "strict-match"
FLEXIBLE_EXTRACT = "flexible-extract"


@dataclass(frozen=True)
class Score:
    """One completion scored against its gold: `invalid` means the main answer had no number."""

    answer: str | None
    answers: dict[str, str | None]
    correct: bool
    invalid: bool


def vllm_answer(text: str) -> int | None:
    """vLLM's `get_answer_value`: the last integer after removing commas, or None (its INVALID)."""
    numbers = _VLLM_NUMBER.findall(text.replace(",", ""))
    return _literal_int(numbers[-1]) if numbers else None


def _literal_int(digits: str) -> int | None:
    """What `ast.literal_eval` gives for a run of `\\d` characters, without compiling it.

    Python source accepts only ASCII digits and no leading zero unless every digit is zero;
    anything else is the SyntaxError vLLM's script counts as invalid. (Compiling costs more
    than the rest of scoring together.)
    """
    if not digits.isascii() or (digits[0] == "0" and digits.strip("0")):
        return None
    try:
        return int(digits)
    except ValueError:  # over Python's int string limit; literal_eval fails the same way
        return None


def strict_match(text: str) -> str:
    """lm-eval's strict-match filter: the first `#### N`, else "[invalid]"."""
    found = _STRICT.findall(text)
    return found[0].strip() if found else LMEVAL_INVALID


def flexible_extract(text: str) -> str:
    """lm-eval's flexible-extract filter: the last number-like run, else "[invalid]"."""
    found = _FLEXIBLE.findall(text)
    if not found:
        return LMEVAL_INVALID
    groups = [g for g in found[-1] if g]
    return groups[0].strip() if groups else LMEVAL_INVALID


def lmeval_normalize(text: str) -> str:
    """What lm-eval's exact_match compares: the gsm8k v3 regexes deleted, then lower case."""
    for pattern in _LMEVAL_IGNORED:
        text = pattern.sub("", text)
    return text.lower()


def gold_answer(style: str, reference: str) -> str:
    """The gold a style compares with, from GSM8K's worked reference answer."""
    if style == "lm-eval":
        return lmeval_normalize(reference)
    # The last number of the whole reference is the last one after its final "####" whenever that
    # part has a digit; scanning only the tail is the same answer at a fraction of the cost.
    tail = reference.rsplit("####", 1)[-1]
    gold = vllm_answer(tail) if _VLLM_NUMBER.search(tail) else vllm_answer(reference)
    return "" if gold is None else str(gold)


def score(style: str, completion: str, gold: str) -> Score:
    """Score one completion in `style` ("vllm", "chat" or "lm-eval") against `gold_answer(style, reference)`."""
    if style == "lm-eval":
        strict, flexible = strict_match(completion), flexible_extract(completion)
        answers: dict[str, str | None] = {
            STRICT_MATCH: None if strict == LMEVAL_INVALID else strict,
            FLEXIBLE_EXTRACT: None if flexible == LMEVAL_INVALID else flexible,
        }
        return Score(
            answer=answers[STRICT_MATCH],
            answers=answers,
            correct=lmeval_normalize(strict) == gold,
            invalid=strict == LMEVAL_INVALID,
        )
    predicted = vllm_answer(completion)
    answer = None if predicted is None else str(predicted)
    return Score(
        answer=answer,
        answers={"vllm": answer},
        correct=answer is not None and answer == gold,
        invalid=answer is None,
    )
