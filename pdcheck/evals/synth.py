"""gsm8k-synth: seeded one- and two-step grade-school word problems in GSM8K's exact format.

Each item is ``{"question": str, "answer": str}``; the answer is worked steps, one per line,
ending in ``#### N`` like GSM8K, so the same prompt styles and answer extraction apply. The
numbers are small (addends up to 15, factors 2-5 times 2-9, every result below 60) so that a few-million-parameter
model trained for minutes on a CPU can really answer, which gives the paired accuracy test a
baseline far from zero (issue 11).

Splits are disjoint by question text: the test split is drawn first from its own stream, and
the train split from another stream, skipping any question the test split holds. Both are pure
functions of the seed, and ``train[:k]`` does not depend on ``n_train``.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator

NAMES = (
    "Ada",
    "Ben",
    "Cara",
    "Dan",
    "Eva",
    "Finn",
    "Gia",
    "Hugo",
    "Ivy",
    "Jack",
    "Kim",
    "Leo",
    "Mia",
    "Ned",
    "Olga",
    "Paul",
    "Rosa",
    "Sam",
    "Tara",
    "Umar",
    "Vera",
    "Will",
    "Yara",
    "Zoe",
)
ITEMS = (
    "apples",
    "pens",
    "books",
    "stickers",
    "marbles",
    "cookies",
    "cards",
    "shells",
    "coins",
    "eggs",
    "flowers",
    "toys",
    "beads",
    "stamps",
    "rocks",
    "candies",
)

Problem = tuple[str, str]


def _add(rng: random.Random, name: str, other: str, item: str) -> Problem:
    a, b = rng.randint(2, 15), rng.randint(2, 15)
    c = a + b
    return (
        f"{name} has {a} {item}. {name} buys {b} more {item}. How many {item} does {name} have now?",
        f"{name} has {a} + {b} = {c} {item} now.\n#### {c}",
    )


def _sub(rng: random.Random, name: str, other: str, item: str) -> Problem:
    a = rng.randint(5, 20)
    b = rng.randint(2, a - 1)
    c = a - b
    return (
        f"{name} has {a} {item}. {name} gives {b} {item} to {other}. How many {item} does {name} have left?",
        f"{name} has {a} - {b} = {c} {item} left.\n#### {c}",
    )


def _mul(rng: random.Random, name: str, other: str, item: str) -> Problem:
    a, b = rng.randint(2, 5), rng.randint(2, 9)
    c = a * b
    return (
        f"{name} has {a} boxes. Each box holds {b} {item}. How many {item} does {name} have?",
        f"{name} has {a} * {b} = {c} {item}.\n#### {c}",
    )


def _add_then_sub(rng: random.Random, name: str, other: str, item: str) -> Problem:
    a, b = rng.randint(2, 12), rng.randint(2, 12)
    d = a + b
    c = rng.randint(2, d - 1)
    e = d - c
    return (
        f"{name} has {a} {item}. {name} buys {b} more {item} and then gives {c} {item} to {other}. "
        f"How many {item} does {name} have now?",
        f"After buying, {name} has {a} + {b} = {d} {item}.\n"
        f"After giving, {name} has {d} - {c} = {e} {item}.\n#### {e}",
    )


def _mul_then_add(rng: random.Random, name: str, other: str, item: str) -> Problem:
    a, b = rng.randint(2, 5), rng.randint(2, 9)
    d = a * b
    c = rng.randint(2, 12)
    e = d + c
    return (
        f"{name} has {a} boxes with {b} {item} in each box and {c} more {item} on the table. "
        f"How many {item} does {name} have in all?",
        f"The boxes hold {a} * {b} = {d} {item}.\n"
        f"In all, {name} has {d} + {c} = {e} {item}.\n#### {e}",
    )


def _add_then_add(rng: random.Random, name: str, other: str, item: str) -> Problem:
    a, b, c = rng.randint(2, 9), rng.randint(2, 9), rng.randint(2, 9)
    d = a + b
    e = d + c
    return (
        f"{name} finds {a} {item} on Monday, {b} {item} on Tuesday and {c} {item} on Wednesday. "
        f"How many {item} does {name} find in all?",
        f"On Monday and Tuesday, {name} finds {a} + {b} = {d} {item}.\n"
        f"In all, {name} finds {d} + {c} = {e} {item}.\n#### {e}",
    )


TEMPLATES: tuple[Callable[[random.Random, str, str, str], Problem], ...] = (
    _add,
    _sub,
    _mul,
    _add_then_sub,
    _mul_then_add,
    _add_then_add,
)


def _problems(rng: random.Random) -> Iterator[dict[str, str]]:
    while True:
        template = rng.choice(TEMPLATES)
        name, other = rng.sample(NAMES, 2)
        question, answer = template(rng, name, other, rng.choice(ITEMS))
        yield {"question": question, "answer": answer}


def _take_unique(
    stream: Iterator[dict[str, str]], n: int, *, exclude: set[str]
) -> list[dict[str, str]]:
    out: list[dict[str, str]] = []
    seen = set(exclude)
    for item in stream:
        if len(out) == n:
            break
        if item["question"] not in seen:
            seen.add(item["question"])
            out.append(item)
    return out


def generate(
    *, seed: int = 0, n_train: int, n_test: int
) -> tuple[list[dict[str, str]], list[dict[str, str]]]:
    """Return ``(train, test)``: disjoint lists of GSM8K-format problems, a pure function of ``seed``."""
    if n_train < 0 or n_test < 0:
        raise ValueError(f"n_train and n_test must be >= 0, got n_train={n_train}, n_test={n_test}")
    test = _take_unique(_problems(random.Random(f"gsm8k-synth/{seed}/test")), n_test, exclude=set())
    train = _take_unique(
        _problems(random.Random(f"gsm8k-synth/{seed}/train")),
        n_train,
        exclude={t["question"] for t in test},
    )
    return train, test
