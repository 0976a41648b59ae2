"""NaN and −inf logprobs (point 7 of issue 17): `compare` neither crashes nor grades them as corruption.

JSON has no NaN or infinity, so the record writer stores both as null; a null alternative
used to be read back as None and `top2_margin` raised TypeError, and a NaN margin compared
false with the tie threshold, which graded the flip as corruption.
"""

from __future__ import annotations

import json

from click.testing import CliRunner

from pdcheck.analysis.agreement import first_divergence
from pdcheck.cli import cli
from pdcheck.evals.records import QuestionRecord, RecordWriter, TokenLogprobs, read_records


def _record(index: int, tokens: tuple[int, ...], top: tuple[tuple[str, float], ...]):
    return QuestionRecord(
        index=index,
        prompt_sha256="p",
        gold="1",
        ok=True,
        completion=" ".join(map(str, tokens)),
        token_ids=tokens,
        logprobs=tuple(TokenLogprobs(str(t), -0.1, top) for t in tokens),
        correct=True,
    )


def test_an_unknown_alternative_gives_an_unknown_margin():
    """A None or NaN alternative (or best) leaves the margin unknown; −inf second best is infinitely sure."""
    nan, inf = float("nan"), float("inf")
    assert TokenLogprobs("a", -0.1, (("a", -0.1), ("b", None))).top2_margin is None
    assert TokenLogprobs("a", -0.1, (("a", -0.1), ("b", nan))).top2_margin is None
    assert TokenLogprobs("a", nan, (("a", nan), ("b", -2.0))).top2_margin is None
    assert TokenLogprobs("a", -0.1, (("a", -0.1), ("b", -inf))).top2_margin == inf
    assert TokenLogprobs("a", -inf, (("a", -inf), ("b", -inf))).top2_margin is None


def test_a_nan_margin_is_unclassified_not_corruption():
    """A flip where the baseline's margin is NaN cannot be graded: it is unclassified."""
    base = _record(0, (1, 2), (("1", -0.1), ("9", float("nan"))))
    pd = _record(0, (1, 9), (("1", -0.1), ("9", -0.2)))
    d = first_divergence(base, pd, tie_epsilon_nats=0.05)
    assert d is not None and d.grade == "unclassified" and d.margin_nats is None


def test_compare_reads_null_alternatives_without_crashing(tmp_path):
    """NaN and −inf alternatives are written as null and read back as None; `compare` still gives a verdict."""
    paths = []
    for name, second in (("b", float("nan")), ("p", float("-inf"))):
        path = tmp_path / f"{name}.jsonl"
        w = RecordWriter(path)
        for i in range(30):
            tokens = (1, 2) if name == "b" or i else (1, 9)
            w.write(_record(i, tokens, (("1", -0.1), ("9", second))))
        w.close()
        paths.append(str(path))
    read = read_records(paths[0])[0].logprobs
    assert read is not None and read[0].top[1][1] is None
    result = CliRunner().invoke(cli, ["compare", *paths, "--allow-inconclusive", "--json"])
    assert result.exit_code == 0, result.output
    agreement = json.loads(result.stdout)["comparison"]["agreement"]
    assert (agreement["n_corruption"], agreement["n_unclassified"]) == (0, 1)
