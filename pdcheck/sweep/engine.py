"""Run a sweep plan: start each topology once, run its units into the store, judge every cell.

The engine owns the order of work and the failure policy; what a server is (backend), how a
question is asked (evals) and what a difference means (analysis) live elsewhere. It never
prints; it emits `SweepEvent`s.

Failure policy: with `continue_on_error` (the default) an exception in a job writes a
failure.json sidecar for every unit it did not finish, those cells come out INFRA-ERROR, and
the sweep goes on. KeyboardInterrupt always propagates: finished units stay done, a half-done
unit keeps its records, and `--resume` carries on from there.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import msgspec

from pdcheck.analysis.kv_digest import KvDigestSummary, join_digests
from pdcheck.analysis.sequential import SequentialTest
from pdcheck.analysis.transfer_evidence import PrefillerLogEvents, count_prefiller_log_events
from pdcheck.analysis.verdict import Outcome, Verdict
from pdcheck.config import Cell, resolve_model_path
from pdcheck.contracts.plugin_files import (
    DIGESTS_FILE,
    INJECTIONS_FILE,
    InjectionRecord,
    decode_digest_lines,
)
from pdcheck.errors import ExitCode, InfraError
from pdcheck.evals.dataset import TaskData
from pdcheck.evals.records import QuestionRecord, read_records
from pdcheck.results.schema import KvEvidence, Provenance, RunSummary
from pdcheck.results.store import CellStore, RunStore, donors
from pdcheck.serving.endpoints import Endpoints
from pdcheck.serving.metrics import KvTransferMetrics
from pdcheck.serving.process import SHUTTING_DOWN, ShuttingDown, signals_unwind
from pdcheck.sweep.backends import Backend
from pdcheck.sweep.early_stop import SequentialRule, UnitStopper
from pdcheck.sweep.events import EventSink, Progress
from pdcheck.sweep.finish import finish_run
from pdcheck.sweep.judging import carry_level, clean_tests, judge_level, level_ready, live_test
from pdcheck.sweep.plan import Job, Placement, Unit, pack, plan_jobs

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class SweepOptions:
    continue_on_error: bool = True
    # Stop a cell's remaining concurrency levels once one level is flagged.
    early_stop: bool = False
    # False: restart servers for every unit and share no baseline (the benchmark's comparison).
    reuse: bool = True
    # The run's clean tests (Holm's family); None: those of the engine's cells. A shard passes
    # the whole selection's, so its early stops hold in the merged run.
    family_size: int | None = None


@dataclass(frozen=True)
class SweepResult:
    root: Path
    exit_code: ExitCode
    summary: RunSummary
    server_starts: int
    jobs: int


class _LevelsOver:
    """The concurrency levels a job is over with (asked, skipped or failed); every level once the
    job is over."""

    def __init__(self) -> None:
        self._changed = threading.Condition()
        self._levels: set[int] = set()
        self._all = False

    def mark(self, level: int) -> None:
        with self._changed:
            self._levels.add(level)
            self._changed.notify_all()

    def mark_all(self) -> None:
        with self._changed:
            self._all = True
            self._changed.notify_all()

    def over(self, level: int) -> bool:
        with self._changed:
            return self._all or level in self._levels

    def wait(self, level: int) -> None:
        with self._changed:
            self._changed.wait_for(lambda: self._all or level in self._levels)


@dataclass(frozen=True)
class _EvalTurn:
    """A CPU wave job's place in its wave's eval order: it asks at a level once `after` (the job
    before it) is over with that level, and marks its own levels in `mine`."""

    after: _LevelsOver | None
    mine: _LevelsOver


@dataclass(frozen=True)
class _Carried:
    """A level early stop skipped: it carries the flagged `verdict` of level `at`."""

    at: int
    verdict: Verdict


class Engine:
    """One sweep run over `cells` into `store`, with servers from `backend`."""

    def __init__(
        self,
        cells: Sequence[Cell],
        *,
        store: RunStore,
        backend: Backend,
        options: SweepOptions = SweepOptions(),
        on_event: EventSink | None = None,
    ):
        self.cells = {c.id: c for c in cells}
        self.store = store
        self.backend = backend
        self.options = options
        self.progress = Progress(on_event)
        self._lock = threading.Lock()
        self._tasks: dict[str, TaskData] = {}
        self._stopped: dict[tuple[str, int], _Carried] = {}
        self._judged: dict[tuple[str, int], Outcome] = {}
        self._tests: dict[tuple[str, int], SequentialTest] = {}
        # Set when the main thread stops waiting for a wave: its other jobs stop too.
        self._cancelled = threading.Event()
        self.family_size = (
            options.family_size if options.family_size is not None else clean_tests(cells)
        )

    def cell_store(self, cell: Cell) -> CellStore:
        return self.store.cell(cell.dirname, self._provenance(cell))

    def _provenance(self, cell: Cell) -> Provenance:
        prov = self.backend.provenance(cell)
        task = self._tasks.get(cell.eval.model_dump_json())
        return prov if task is None else msgspec.structs.replace(prov, dataset_sha256=task.sha256)

    def _task(self, cell: Cell) -> TaskData:
        from pdcheck.evals import load_task

        key = cell.eval.model_dump_json()
        with self._lock:
            if key not in self._tasks:
                self._tasks[key] = load_task(cell.eval)
            return self._tasks[key]

    def run(self, *, before_finish: Callable[[], None] | None = None) -> SweepResult:
        """Run every pending unit, judge every cell, then `before_finish` (the race harness) and finish."""
        jobs = self.execute()
        if before_finish is not None:
            before_finish()
        return self.finish(server_starts=self.progress.server_starts, jobs=jobs)

    def execute(self) -> int:
        """Run the plan's pending units and judge every cell; returns the number of jobs planned."""
        cells = list(self.cells.values())
        jobs = plan_jobs(
            cells,
            reuse=self.options.reuse,
            build_fingerprint=lambda c: _fingerprint(self.backend.provenance(c)),
        )
        waves = pack(jobs, gpu_indices=self.backend.gpu_indices)
        for cell in cells:
            self._task(cell)
            cs = self.cell_store(cell)
            cs.write_cell(
                resolved=cell.resolved(),
                name=cell.name,
                cell_id=cell.id,
                baseline_key=cell.baseline_key(),
                canary=cell.arm.canary,
            )
        self.progress.cells_total = len(cells)
        self.progress.questions_total = sum(self._questions(u) for j in jobs for u in j.units)
        self.progress.emit(
            "planned", f"{len(cells)} cells, {len(jobs)} topologies, {len(waves)} waves"
        )
        self._cancelled.clear()
        # Ctrl-C and SIGTERM unwind the main thread and stop the waits of the wave's threads.
        with signals_unwind():
            try:
                for wave in waves:
                    if len(wave) == 1:
                        self._run_job(wave[0])
                        continue
                    self._run_wave(wave)
            finally:
                self.backend.close()
        for cell in cells:
            self._judge_cell(cell)
        return len(jobs)

    def finish(self, *, server_starts: int = 0, jobs: int = 0) -> SweepResult:
        """junit.xml and report.md from the store, then summary.json last (its presence means finished)."""
        summary = finish_run(self.store).summary
        assert summary is not None  # finish_run sets it
        self.progress.emit("finished", f"exit code {summary.exit_code}")
        return SweepResult(
            self.store.root, ExitCode(summary.exit_code), summary, server_starts, jobs
        )

    def _questions(self, unit: Unit) -> int:
        cell = self.cells[unit.cell_id]
        task = self._tasks[cell.eval.model_dump_json()]
        return len(task.indices(limit=cell.eval.limit, offset=cell.eval.offset))

    # -- jobs -----------------------------------------------------------------------------

    def _pending(self, job: Job) -> list[Unit]:
        cs = self.cell_store(job.cell)
        return [
            u
            for u in job.units
            if not cs.unit_done(u.side, u.concurrency, u.repeat)
            and (u.cell_id, u.concurrency) not in self._stopped
        ]

    def _run_wave(self, wave: Sequence[Placement]) -> None:
        """The wave's jobs at once, one thread each. Whatever ends the main thread's wait (an
        interrupt, or a job's error without `continue_on_error`) cancels the others' evals
        before the pool joins them."""
        turns = self._eval_turns(len(wave))
        with ThreadPoolExecutor(max_workers=len(wave)) as pool:
            futures = [pool.submit(self._run_job, p, t) for p, t in zip(wave, turns, strict=True)]
            try:
                for fut in futures:
                    fut.result()
            except BaseException:
                self._cancelled.set()
                raise

    def _eval_turns(self, jobs: int) -> list[_EvalTurn | None]:
        """On CPU a wave's jobs share it to overlap their server starts (`pack`), and their evals
        go one level behind the job before them: a PD job asks at a level once the baseline is
        done with it (early stop pairs against it), and the canary after it once the clean job
        is. So at most two evals share the two cores, one of them the lighter c1.
        GPU jobs of a wave run on their own GPUs, at once."""
        if self.backend.gpu_indices:
            return [None] * jobs
        levels = [_LevelsOver() for _ in range(jobs)]
        return [_EvalTurn(levels[i - 1] if i else None, levels[i]) for i in range(jobs)]

    def _run_job(self, placement: Placement, turn: _EvalTurn | None = None) -> None:
        try:
            self._serve_job(placement, turn)
        finally:
            if turn is not None:
                turn.mine.mark_all()

    def _serve_job(self, placement: Placement, turn: _EvalTurn | None) -> None:
        job = placement.job
        cell = job.cell
        cs = self.cell_store(cell)
        if job.side == "baseline" and self.options.reuse:
            self._adopt_baseline(job, cs)
        pending = self._pending(job)
        with self._lock:
            self.progress.questions_done += sum(
                self._questions(u) for u in job.units if u not in pending
            )
        if turn is not None:  # levels done in an earlier run hold no one up
            for level in {u.concurrency for u in job.units} - {u.concurrency for u in pending}:
                turn.mine.mark(level)
        if pending:
            self._set(cell, f"starting {job.side} servers")
            try:
                if job.side == "baseline":
                    with self.backend.baseline(
                        cell, gpus=placement.gpus, cell_dir=cs.dir
                    ) as endpoints:
                        self._count_start(cs, endpoints)
                        for unit in pending:
                            self._wait_turn(cell, turn, unit.concurrency)
                            self._run_unit(cell, cs, unit, endpoints)
                            # The sharing cells' PD jobs may be waiting for this level.
                            self._share_baseline(job, cs, (unit,))
                            self._level_over(pending, turn, unit)
                else:
                    with self.backend.pd(
                        cell, gpus=placement.gpus, cell_dir=cs.dir, prefill_key=job.prefill_key
                    ) as endpoints:
                        self._count_start(cs, endpoints)
                        pending = self._pending(job)
                        for unit in pending:
                            # A flagged earlier level of this cell skips the rest (early stop).
                            if (unit.cell_id, unit.concurrency) not in self._stopped:
                                self._wait_turn(cell, turn, unit.concurrency)
                                self._run_unit(cell, cs, unit, endpoints)
                                self._judge_cell(cell, only=unit.concurrency)
                            self._level_over(pending, turn, unit)
            except Exception as exc:
                # Stopped by an interrupt: not a failure of this job; --resume finishes it.
                if not self.options.continue_on_error or self._stopping():
                    raise
                logger.warning("%s failed: %s", job.label, exc)
                for unit in self._pending(job):
                    cs.write_unit_failure(unit.side, unit.concurrency, unit.repeat, exc)
                self.progress.emit("failure", f"{job.label}: {type(exc).__name__}: {exc}")
        if job.side == "baseline":
            self._share_baseline(job, cs, job.units)

    def _wait_turn(self, cell: Cell, turn: _EvalTurn | None, level: int) -> None:
        if turn is not None and turn.after is not None and not turn.after.over(level):
            self._set(cell, f"servers up, waiting for the previous job's c{level} evals")
            turn.after.wait(level)

    @staticmethod
    def _level_over(units: Sequence[Unit], turn: _EvalTurn | None, unit: Unit) -> None:
        """Mark the unit's level over for the next job once it is the last of `units` (what the
        job runs) at that level."""
        if turn is not None and unit == [u for u in units if u.concurrency == unit.concurrency][-1]:
            turn.mine.mark(unit.concurrency)

    def _adopt_baseline(self, job: Job, cs: CellStore) -> None:
        """Copy finished baseline units from any cell in the run folder with the same key and build
        (an earlier shard of work: another pytest item, or a cell selected in an earlier run)."""
        fingerprint = _fingerprint(cs.provenance)
        for donor in donors(self.store.root, job.cell.baseline_key(), exclude=cs.dirname):
            if donor.provenance is None or _fingerprint(donor.provenance) != fingerprint:
                continue
            source = self.store.cell(donor.dirname, donor.provenance)
            for unit in job.units:
                if not cs.unit_done("baseline", unit.concurrency, unit.repeat) and source.unit_done(
                    "baseline", unit.concurrency, unit.repeat
                ):
                    cs.copy_baseline_unit(source, unit.concurrency, unit.repeat)

    def _share_baseline(self, job: Job, source: CellStore, units: Sequence[Unit]) -> None:
        """Copy `units` of the baseline (or their failures) to the cells that share it."""
        for other in job.shares:
            target = self.cell_store(other)
            for unit in units:
                if target.unit_done("baseline", unit.concurrency, unit.repeat):
                    continue
                if source.unit_done("baseline", unit.concurrency, unit.repeat):
                    target.copy_baseline_unit(source, unit.concurrency, unit.repeat)
                    continue
                target.copy_unit_failure(source, "baseline", unit.concurrency, unit.repeat)

    def _run_unit(self, cell: Cell, cs: CellStore, unit: Unit, endpoints: Endpoints) -> None:
        from pdcheck.evals import run_eval

        self._set(cell, f"eval {unit.side} c{unit.concurrency} r{unit.repeat}")
        kv = endpoints if unit.side == "pd" else None

        def watchdog() -> None:
            """Every server of the unit still running and the run not stopping, or raise."""
            if self._stopping():
                raise ShuttingDown("the sweep is stopping")
            endpoints.check_alive()

        before = _scrape(kv, watchdog) if kv is not None else None
        log_offsets = _prefiller_log_sizes(kv) if kv is not None else None
        stopper = self._stopper(cell, cs, unit)

        def on_record(record: QuestionRecord) -> None:
            with self._lock:
                self.progress.questions_done += 1
            self.progress.emit("record")

        try:
            summary = run_eval(
                endpoints.url(unit.side),
                self._task(cell),
                settings=cell.eval,
                concurrency=unit.concurrency,
                out_path=cs.records_path(unit.side, unit.concurrency, unit.repeat),
                model=resolve_model_path(cell.model.path),
                run_tag=unit.run_tag,
                on_record=on_record,
                should_stop=stopper,
                watchdog=watchdog,
            )
        except Exception:
            watchdog()  # a crashed server is the cause to report, not the requests it failed
            raise
        stop = stopper.stop if stopper is not None else None
        if stop is not None:
            self.progress.emit(
                "verdict", f"{cell.name} c{unit.concurrency}: early stop ({stop.reason})"
            )
        watchdog()
        if kv is not None:
            after = _scrape(kv, watchdog)
            evidence = KvEvidence(
                decoders=_kv_deltas(before, after),
                metrics_urls=tuple(kv.decoder_metrics_urls),
                injections=_injections(kv, unit.run_tag),
                kv_digest=_kv_digest(kv, unit.run_tag),
                prefiller_events=_prefiller_events(log_offsets),
            )
            cs.write_kv(unit.concurrency, unit.repeat, evidence)
        cs.write_unit_summary(unit.side, unit.concurrency, unit.repeat, summary, early_stop=stop)
        accuracy = "n/a" if summary.accuracy is None else f"{summary.accuracy:.3f}"
        self.progress.emit(
            "unit-done",
            f"{cell.name} {unit.side} c{unit.concurrency} r{unit.repeat}: "
            f"accuracy {accuracy} ({summary.n} questions)",
        )

    def _stopping(self) -> bool:
        return self._cancelled.is_set() or SHUTTING_DOWN.is_set()

    def _early_stop(self, cell: Cell) -> bool:
        return self.options.early_stop or cell.analysis.early_stop

    def _stopper(self, cell: Cell, cs: CellStore, unit: Unit) -> UnitStopper | None:
        """With early stop, a PD unit whose baseline is done is checked as its records arrive,
        by its level's one test (shared by the level's repeats)."""
        if unit.side != "pd" or not self._early_stop(cell):
            return None
        if not all(cs.unit_done("baseline", unit.concurrency, r) for r in range(cell.eval.repeats)):
            return None
        key = (cell.id, unit.concurrency)
        if key not in self._tests:
            self._tests[key] = live_test(
                cell,
                cs,
                unit.concurrency,
                family_size=self.family_size,
                planned_questions=self._questions(unit),
            )
        baseline = read_records(cs.records_path("baseline", unit.concurrency, unit.repeat))
        return UnitStopper(baseline, SequentialRule(self._tests[key]))

    # -- judging --------------------------------------------------------------------------

    def _judge_cell(self, cell: Cell, *, only: int | None = None) -> None:
        """Judge the cell's ready levels (or just `only`) once per run; a cell is done when all are judged."""
        cs = self.cell_store(cell)
        for c in cell.concurrency:
            if (only is not None and c != only) or (cell.id, c) in self._judged:
                continue
            carried = self._stopped.get((cell.id, c))
            if carried is not None:
                judged = carry_level(cell, cs, c, flagged=carried.verdict, at=carried.at)
            elif not level_ready(cell, cs, c):
                continue
            else:
                judged = judge_level(
                    cell,
                    cs,
                    c,
                    family_size=self.family_size,
                    early_stop=self._early_stop(cell),
                    planned_questions=self._questions(Unit(cell.id, "pd", c, 0)),
                )
            outcome = judged.outcome
            with self._lock:
                self._judged[(cell.id, c)] = outcome
                self.progress.verdicts[outcome.verdict] += 1
                self.progress.cells_done = sum(
                    all((k.id, level) in self._judged for level in k.concurrency)
                    for k in self.cells.values()
                )
            self.progress.emit("verdict", f"{cell.name} c{c}: {outcome.verdict} ({outcome.reason})")
            # Only a measured drop ends the cell: a flag from the KV evidence alone leaves the
            # higher levels, where a freed block is really reused, to show what it costs.
            if self._early_stop(cell) and judged.verdict.stops_higher_levels:
                for later in cell.concurrency:
                    if later > c:
                        self._stopped.setdefault((cell.id, later), _Carried(c, outcome.verdict))

    def _set(self, cell: Cell, phase: str) -> None:
        self.progress.current_cell = cell.name
        self.progress.phase = phase
        self.progress.emit("phase", f"{cell.name}: {phase}")

    def _count_start(self, cs: CellStore, endpoints: Endpoints) -> None:
        with self._lock:
            self.progress.server_starts += 1
            if endpoints.started is not None:
                cs.record_started(endpoints.started)


def _fingerprint(prov: Provenance) -> str:
    return f"{prov.vllm_version}@{prov.vllm_commit}"


def _scrape(endpoints: Endpoints, watchdog: Callable[[], None]) -> list[KvTransferMetrics]:
    """The decoders' KV metrics; a decoder that does not answer is reported by `watchdog` as the
    server (or node) it lost, where it can tell, rather than as an unread metrics page."""
    from pdcheck.serving import scrape_kv_metrics

    try:
        return [scrape_kv_metrics(url) for url in endpoints.decoder_metrics_urls]
    except InfraError:
        watchdog()
        raise


def _kv_deltas(
    before: list[KvTransferMetrics] | None, after: list[KvTransferMetrics]
) -> tuple[KvTransferMetrics, ...]:
    """Per-decoder deltas over the unit; empty means no metrics URL (attach without one)."""
    return tuple(a.minus(b) for a, b in zip(after, before or [], strict=False))


def _prefiller_log_sizes(endpoints: Endpoints) -> dict[str, int] | None:
    """Each prefiller log's size now, where the unit's stretch of it starts; None when attached."""
    if endpoints.started is None:
        return None
    return {
        s.log_path: _size(Path(s.log_path))
        for s in endpoints.started.servers
        if s.role == "prefill"
    }


def _size(path: Path) -> int:
    return path.stat().st_size if path.is_file() else 0


def _prefiller_events(offsets: dict[str, int] | None) -> PrefillerLogEvents | None:
    """The release events the prefillers logged since `offsets` (a later unit starts after)."""
    if offsets is None:
        return None
    events = PrefillerLogEvents()
    for path, start in offsets.items():
        log = Path(path)
        if log.is_file():
            with log.open("rb") as f:
                f.seek(start)
                text = f.read().decode("utf-8", "replace")
            events = events.plus(count_prefiller_log_events(text))
    return events


def _kv_digest(endpoints: Endpoints, run_tag: str) -> KvDigestSummary | None:
    """The join of this unit's KV digests, from every PD server's `kv-digests.jsonl` (the
    prefillers' lines are keyed by their own request ids, so all of them are read)."""
    servers = endpoints.started.servers if endpoints.started else ()
    folders = [s.plugin_dir for s in servers if s.role != "baseline"]
    records = decode_digest_lines(_plugin_log_lines(folders, DIGESTS_FILE))
    return join_digests(records, run_tag=run_tag) if records else None


def _plugin_log_lines(folders: Iterable[str], name: str) -> list[str]:
    """The non-empty lines of the plugin's log `name` in each of `folders` that has one."""
    lines: list[str] = []
    for folder in folders:
        log = Path(folder) / name
        if log.is_file():
            lines += [line for line in log.read_text().splitlines() if line.strip()]
    return lines


def _injections(endpoints: Endpoints, run_tag: str) -> tuple[InjectionRecord, ...]:
    """The plugin's injection records of this unit (its run tag), from every decoder."""
    records = (
        msgspec.json.decode(line, type=InjectionRecord)
        for line in _plugin_log_lines(endpoints.plugin_dirs, INJECTIONS_FILE)
    )
    return tuple(r for r in records if r.x_request_id.startswith(f"{run_tag}-q"))
