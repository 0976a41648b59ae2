"""Judge one cell at one concurrency level from what the store holds, and record the verdict.

This module loads and records; it decides nothing. `level_evidence` reads the baseline and PD
records of that level, pairs them with `compare_paired`, replays every repeat's pairs through
the level's one test (`analysis.design`), and gathers the KV digests, transfer evidence and
exactness check into one `LevelEvidence`; `analysis.verdict.decide` turns that into the
`CellVerdict` (every route is listed there); `judge_expected` applies the canary logic, and
`_record` writes verdicts/c<N>.json.

A level is judged as soon as it is ready, at alpha / F (F: the hypotheses of the whole
selection's clean tests, every shard included), which is Holm's first step: a flag given then
stands. When the run finishes, `apply_family` applies Holm across the clean tests present, in a
family of the planned F, and re-judges the levels whose call it changes.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from pdcheck.analysis.design import Design
from pdcheck.analysis.exact import ExactCheck
from pdcheck.analysis.family import FamilyMember, FamilyVerdict, decide_alone, decide_family
from pdcheck.analysis.injection import InjectionPrecision
from pdcheck.analysis.paired import PairedComparison
from pdcheck.analysis.sequential import SequentialTest, sequential_result
from pdcheck.analysis.transfer_evidence import transfer_evidence
from pdcheck.analysis.verdict import (
    Carried,
    CellVerdict,
    LevelEvidence,
    Outcome,
    TestDecision,
    Verdict,
    decide,
    judge,
    suspect_p,
)
from pdcheck.config import Cell, level_expectation
from pdcheck.contracts.kv_lease import KvLease, kv_lease
from pdcheck.evals.dataset import SYNTH_N_TEST
from pdcheck.evals.records import QuestionRecord
from pdcheck.results.load import CellResult, kv_tokens
from pdcheck.results.schema import KvEvidence
from pdcheck.results.store import CellStore, RunStore, load_cell, load_run
from pdcheck.serving.endpoints import TopologyRecord
from pdcheck.sweep.plan import SIDES, Unit


@dataclass(frozen=True)
class JudgedLevel:
    """What judging a level recorded: the decided verdict and its outcome against the arm."""

    verdict: CellVerdict
    outcome: Outcome


def level_ready(cell: Cell, cs: CellStore, concurrency: int) -> bool:
    """Every unit of the level is done or failed: a verdict can be given now."""
    for side in SIDES:
        for r in range(cell.eval.repeats):
            unit = cs.dir / side / f"c{concurrency}" / f"r{r}"
            if not ((unit / "summary.json").is_file() or (unit / "failure.json").is_file()):
                return False
    return True


def suspect_planned(cell: Cell) -> bool:
    """SUSPECT is judged at every level of this cell: logprobs, and baseline repeats as control."""
    return cell.eval.logprobs and cell.eval.repeats >= 2


def clean_tests(cells: Iterable[Cell]) -> int:
    """The family's size: the hypotheses of every level expected not to be flagged (clean arms,
    race arms where their race cannot fire), one for accuracy and one for SUSPECT where it is
    judged. Canaries' levels are outside it."""
    return sum(
        1 + suspect_planned(cell)
        for cell in cells
        for c in cell.concurrency
        if not level_expectation(cell, c).flag
    )


def test_key(cell: Cell, concurrency: int) -> str:
    return f"{cell.id}@c{concurrency}"


def level_design(
    cell: Cell,
    concurrency: int,
    *,
    family_size: int,
    planned_questions: int,
    early_stop: bool,
) -> Design:
    """The level's one test: every repeat's pairs, at the policy's margin.

    The margin is never widened by the baseline's run-to-run jitter: the paired test already
    carries that noise (a discordant pair is one), and a floor estimated from two or three runs
    moved the margin by chance (issue 30).
    """
    policy = cell.analysis
    canary = level_expectation(cell, concurrency).flag
    return Design.plan(
        planned_questions * cell.eval.repeats,
        alpha=policy.alpha,
        margin_pts=policy.margin_pts,
        family_size=1 if canary else max(family_size, 1),
        early_stop=early_stop,
    )


def planned_questions(cell: Cell) -> int:
    """The questions a level of `cell` asks per repeat: its limit, else GSM8K's test split (the
    synthetic stand-in has as many) from its offset."""
    return cell.eval.limit or max(SYNTH_N_TEST - cell.eval.offset, 1)


def clean_level_designs(
    cells: Sequence[Cell], *, family_size: int
) -> list[tuple[Cell, int, Design]]:
    """(cell, concurrency, design) of every clean level of `cells`, as a run would plan them."""
    return [
        (
            cell,
            c,
            level_design(
                cell,
                c,
                family_size=family_size,
                planned_questions=planned_questions(cell),
                early_stop=cell.analysis.early_stop,
            ),
        )
        for cell in cells
        for c in cell.concurrency
        if not level_expectation(cell, c).flag
    ]


def sizing_lines(cells: Sequence[Cell], *, family_size: int) -> list[str]:
    """For each distinct clean design of `cells`, the largest observed discordance d at which it
    still meets the power rule (the per-level cut), what to change past it, and for the whole
    selection the true d at which a clean sweep passes the gate 95% and 50% of the time
    (`pdcheck validate`, `--dry-run`)."""
    from pdcheck.analysis.power import SIZING_TOLERANCE, sweep_pass_points, tolerated_discordance

    groups: dict[tuple[Design, float, bool, bool], list[str]] = {}
    for cell, c, design in clean_level_designs(cells, family_size=family_size):
        policy = cell.analysis
        key = (
            design,
            policy.power_extra_pts,
            policy.allow_no_drop_shown,
            policy.allow_inconclusive,
        )
        groups.setdefault(key, []).append(f"{cell.name}@c{c}")
    lines = []
    for (design, extra, _, _), levels in groups.items():
        d = tolerated_discordance(design, extra_pts=extra, tolerance=SIZING_TOLERANCE)
        early = ", early stop" if len(design.looks) > 1 else ""
        # The bisection returns the low end of a bracket SIZING_TOLERANCE wide: print its middle.
        lines.append(
            f"sizing: {len(levels)} clean level(s) of {design.planned_pairs} pairs (margin "
            f"{design.margin_pts:g} pts, {design.family_size} hypotheses{early}) meet the power "
            f"rule while PD and the baseline disagree on at most d = "
            f"{100 * (d + SIZING_TOLERANCE / 2):.1f}% of their pairs (observed); above it a level is "
            "INCONCLUSIVE unless its drop is shown within the margin (fix: more questions, "
            "eval.repeats, a wider analysis.margin_pts, or the bit-exact mode)"
        )
    if groups:
        points = sweep_pass_points(
            [(g, extra, len(levels), nds, inc) for (g, extra, nds, inc), levels in groups.items()]
        )
        said = [
            f"{100 * target:g}% of the time up to a true d = "
            + ("(never: false alarms alone)" if d is None else f"{100 * d:.1f}%")
            for target, d in points.items()
        ]
        lines.append(
            f"sweep: a clean run of these {sum(map(len, groups.values()))} clean level(s) (no "
            "drop, every level at the same true discordance d) passes the gate "
            f"{' and '.join(said)} (exact per level, levels taken as independent); the cuts "
            "above are on each level's observed d"
        )
    return lines


def live_test(
    cell: Cell, cs: CellStore, concurrency: int, *, family_size: int, planned_questions: int
) -> SequentialTest:
    """The level's test for early stop, with the PD repeats already done fed in (a resumed run)."""
    units = [u for u in load_cell(cs.dir).units if u.concurrency == concurrency and u.done]
    baseline = {u.repeat: u.records() for u in units if u.side == "baseline"}
    design = level_design(
        cell,
        concurrency,
        family_size=family_size,
        planned_questions=planned_questions,
        early_stop=True,
    )
    test = SequentialTest(design)
    for u in sorted((u for u in units if u.side == "pd"), key=lambda u: u.repeat):
        base = {r.index: r for r in baseline.get(u.repeat, ())}
        for r in u.records():
            b = base.get(r.index)
            if b is not None and b.ok and r.ok:
                test.add(baseline_correct=b.correct, pd_correct=r.correct)
    return test


def judge_level(
    cell: Cell,
    cs: CellStore,
    concurrency: int,
    *,
    family_size: int = 1,
    early_stop: bool | None = None,
    planned_questions: int | None = None,
    design: Design | None = None,
    family: FamilyVerdict | None = None,
) -> JudgedLevel:
    """Judge the level at alpha / `family_size`, or with the run's `family` call once known.

    `design` (a re-judgment: the one the level was judged with) overrides the rest; otherwise
    early stop defaults to the cell's policy and the planned questions to the baseline's.
    """
    evidence, comparison, injection, exact = level_evidence(
        cell,
        cs,
        concurrency,
        family_size=family_size,
        early_stop=early_stop,
        planned_questions=planned_questions,
        design=design,
        family=family,
    )
    verdict = decide(evidence, policy=cell.analysis)
    return _record(
        cell, cs, concurrency, verdict, comparison=comparison, injection=injection, exact=exact
    )


def level_evidence(
    cell: Cell,
    cs: CellStore,
    concurrency: int,
    *,
    family_size: int = 1,
    early_stop: bool | None = None,
    planned_questions: int | None = None,
    design: Design | None = None,
    family: FamilyVerdict | None = None,
) -> tuple[LevelEvidence, PairedComparison | None, InjectionPrecision | None, ExactCheck | None]:
    """Load what the store holds for the level into one `LevelEvidence` (and the comparison,
    injection precision and exactness check the verdict file records beside it)."""
    from pdcheck.analysis import compare_paired

    result = load_cell(cs.dir)
    units = [u for u in result.units if u.concurrency == concurrency]
    failed = [u for u in units if not u.done]
    if failed:
        first = failed[0]
        why = (
            f"{first.failure.error_type} in {first.side} c{concurrency}: {first.failure.first_line}"
            if first.failure
            else f"{first.side} c{concurrency} did not finish"
        )
        return LevelEvidence(infra_error=why), None, None, None
    pd = {u.repeat: u.records() for u in units if u.side == "pd"}
    baseline_all = {u.repeat: u.records() for u in units if u.side == "baseline"}
    repeats = sorted(r for r in pd if r in baseline_all)
    # An early-stopped PD unit answered fewer questions: pair each baseline repeat over the
    # questions its PD repeat asked.
    baseline = {}
    for r in repeats:
        asked = {x.index for x in pd[r]}
        baseline[r] = [x for x in baseline_all[r] if x.index in asked]
    policy = cell.analysis
    comparison = compare_paired(
        baseline[0],
        pd[0],
        alpha=policy.alpha,
        tie_epsilon_nats=policy.tie_epsilon_nats,
        margin_pts=policy.margin_pts,
        baseline_repeats=tuple(baseline[r] for r in repeats if r != 0),
        pd_repeats=tuple(pd[r] for r in repeats if r != 0),
        expected_accuracy=cell.model.expected_accuracy,
        expected_rtol=cell.model.expected_rtol,
    )
    runs = [(baseline_all[r], pd[r]) for r in repeats]
    if design is None:
        design = level_design(
            cell,
            concurrency,
            family_size=family_size,
            planned_questions=planned_questions or len(baseline_all[0]),
            early_stop=policy.early_stop if early_stop is None else early_stop,
        )
    decision = _decision(
        cell, concurrency, runs, design, suspect=suspect_p(comparison), family=family
    )
    kv = [result.kv.get((concurrency, r)) for r in repeats]
    lease = _prefiller_lease(result.servers)
    exact = level_exact_check(cell, result.servers, runs)
    evidence = LevelEvidence(
        comparison=comparison,
        decision=decision,
        kv_transferred_tokens=kv_tokens(result.kv, concurrency),
        digests=tuple(k.kv_digest if k is not None else None for k in kv),
        transfers=tuple(
            transfer_evidence(k.decoders, k.prefiller_events, lease=lease)
            for k in kv
            if k is not None
        ),
        exact=exact,
        expected_flag=level_expectation(cell, concurrency).flag,
        injecting=cell.arm.inject is not None,
    )
    injection = None
    if cell.arm.inject is not None:
        injection = _injection_precision(
            comparison,
            result.kv.get((concurrency, 0)),
            pd[0],
            run_tag=Unit(cell.id, "pd", concurrency, 0).run_tag,
        )
    return evidence, comparison, injection, exact


def _prefiller_lease(servers: Sequence[TopologyRecord]) -> KvLease | None:
    """The lease of the cell's prefillers (they share the cell's connector config); None in
    attach mode, where pdcheck did not start them."""
    from pdcheck.serving.argv import flag_value

    for topology in servers:
        for server in topology.servers:
            if server.role == "prefill":
                return kv_lease(flag_value(server.argv, "--kv-transfer-config"))
    return None


def level_exact_check(
    cell: Cell,
    servers: Sequence[TopologyRecord],
    runs: Sequence[tuple[Sequence[QuestionRecord], Sequence[QuestionRecord]]],
) -> ExactCheck | None:
    """The level's greedy identity against its baseline, for a cell in bit-exact mode (None
    otherwise), judged exactly where `contracts.batch_invariance` says the cell is exact on the
    platform its servers ran on: decided from the configuration, never from the divergences."""
    from pdcheck.analysis.exact import check_exact
    from pdcheck.serving.argv import cell_exactness

    if not cell.serving.bit_exact:
        return None
    platforms = {s.platform for s in servers}
    if len(platforms) == 1:
        decision = cell_exactness(cell, platform=platforms.pop(), served_vllm=_served_vllm(servers))
        exact, reason = decision.exact, decision.reason
    else:
        exact = False
        reason = (
            "attach mode: pdcheck did not start the servers, so it cannot know their kernels"
            if not platforms
            else f"the cell's servers ran on several platforms ({', '.join(sorted(platforms))})"
        )
    return check_exact(
        runs, exact=exact, reason=reason, tie_epsilon_nats=cell.analysis.tie_epsilon_nats
    )


def _served_vllm(servers: Sequence[TopologyRecord]) -> frozenset[str]:
    """The vLLM versions the servers ran, as the plugin's activation markers name them."""
    from pdcheck.contracts.plugin_files import read_activation_markers

    return frozenset(
        marker.vllm_version
        for topology in servers
        for server in topology.servers
        for marker in read_activation_markers(Path(server.plugin_dir))
        if marker.vllm_version
    )


def _decision(
    cell: Cell,
    concurrency: int,
    runs: list[tuple[list[QuestionRecord], list[QuestionRecord]]],
    design: Design,
    *,
    suspect: float | None,
    family: FamilyVerdict | None,
) -> TestDecision:
    """The level's test replayed from the records (PD in finish order, repeat after repeat),
    with its worst case (PD's failed requests as wrong) and the run's call on it."""
    seq = sequential_result(runs, design)
    worst = sequential_result(runs, design, pd_errors_wrong=True)
    member = FamilyMember(
        key=test_key(cell, concurrency),
        p_value=seq.p_value,
        sequential_p=seq.sequential_p,
        within_margin=seq.within_margin,
        canary=level_expectation(cell, concurrency).flag,
        worst_case_p=worst.sequential_p if worst.n_pairs > seq.n_pairs else None,
        worst_case_within_margin=worst.within_margin,
        suspect_p=suspect,
    )
    if family is None:
        family = decide_alone(member, alpha=design.alpha, family_size=design.family_size)
    return TestDecision(
        design=design,
        member=member,
        family=family,
        early_stop=seq.stop.reason if seq.stop is not None else None,
        worse=seq.worse,
        better=seq.better,
        n_pairs=seq.n_pairs,
    )


def apply_family(store: RunStore) -> int:
    """Holm across the run's clean tests in the planned family; re-judge the levels whose call
    it changes.

    The family size is the one the levels were planned with (every shard's hypotheses), so a
    shard's call is never more liberal than the merged run's, and a merged run's equals the
    unsharded one. Returns how many levels were re-judged. Canaries keep their own call. Levels
    without a test (infra errors, levels carried by an early stop) are not in the family.
    """
    results = load_run(store.root)
    tests: list[tuple[CellResult, Cell, int, FamilyMember, CellVerdict]] = []
    for cell in results.cells:
        spec = cell.spec
        if spec is None:
            continue
        for c, entry in cell.verdicts.items():
            v = entry.verdict
            if v.sequential_p_value is None or entry.carried_from is not None:
                continue
            member = FamilyMember(
                key=test_key(spec, c),
                p_value=v.p_value if v.p_value is not None else 1.0,
                sequential_p=v.sequential_p_value,
                within_margin=bool(v.within_margin),
                canary=level_expectation(spec, c).flag,
                worst_case_p=v.worst_case_p_value,
                worst_case_within_margin=bool(v.worst_case_within_margin),
                suspect_p=v.suspect_p_value,
            )
            tests.append((cell, spec, c, member, v))
    if not tests:
        return 0
    alpha = tests[0][1].analysis.alpha
    planned = max(
        (t[4].design.family_size for t in tests if t[4].design is not None and not t[3].canary),
        default=0,
    )
    calls = decide_family([t[3] for t in tests], alpha=alpha, family_size=planned)
    changed = 0
    for (cell, spec, c, _member, v), call in zip(tests, calls, strict=True):
        if (
            call.adjusted_p == v.adjusted_p_value
            and call.family_size == v.family_size
            and call.suspect_adjusted_p == v.suspect_adjusted_p_value
        ):
            continue
        cs = store.cell(cell.dirname, cell.provenance)
        # The design the level was judged with: its looks were taken at its family size.
        judge_level(spec, cs, c, design=v.design, family=call)
        changed += 1
    return changed


def _injection_precision(
    comparison: PairedComparison,
    evidence: KvEvidence | None,
    pd: list[QuestionRecord],
    *,
    run_tag: str,
) -> InjectionPrecision | None:
    """Which injected questions the agreement check flagged (corruption-grade divergences)."""
    from pdcheck.analysis import divergence_precision

    if evidence is None or evidence.injections is None:
        return None  # attach mode or no plugin folder: no log to compare against
    return divergence_precision(
        evidence.injections,
        comparison.agreement,
        run_tag=run_tag,
        questions=[r.index for r in pd],
    )


def carry_level(
    cell: Cell, cs: CellStore, concurrency: int, *, flagged: Verdict, at: int
) -> JudgedLevel:
    """A level not run because level `at` was flagged (early stop): it carries that verdict."""
    verdict = decide(LevelEvidence(carried=Carried(at, flagged)), policy=cell.analysis)
    return _record(cell, cs, concurrency, verdict, carried_from=at)


def judge_expected(cell: Cell, concurrency: int, verdict: Verdict, reason: str) -> Outcome:
    """The canary logic at one level: a race arm's level where the race cannot fire is a control."""
    expected = level_expectation(cell, concurrency)
    if cell.arm.canary:
        reason = f"{expected.why}; {reason}" if reason else expected.why
    return judge(
        verdict,
        reason,
        canary=expected.flag,
        allow_inconclusive=cell.analysis.allow_inconclusive,
        allow_no_drop_shown=cell.analysis.allow_no_drop_shown,
    )


def _record(
    cell: Cell,
    cs: CellStore,
    concurrency: int,
    verdict: CellVerdict,
    *,
    comparison: PairedComparison | None = None,
    injection: InjectionPrecision | None = None,
    carried_from: int | None = None,
    exact: ExactCheck | None = None,
) -> JudgedLevel:
    outcome = judge_expected(cell, concurrency, verdict.verdict, verdict.reason)
    cs.write_verdict(
        concurrency,
        verdict=verdict,
        outcome=outcome,
        comparison=comparison,
        injection=injection,
        carried_from=carried_from,
        exact=exact,
    )
    return JudgedLevel(verdict, outcome)
