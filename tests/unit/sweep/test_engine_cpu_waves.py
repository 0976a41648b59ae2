"""The engine on CPU: a wave's servers start together, and its jobs' evals take turns in plan order."""

from __future__ import annotations

import contextlib
import threading
import time

from pdcheck.analysis.verdict import Verdict
from pdcheck.config import expand_cells, load_sweep
from pdcheck.serving import Endpoints
from pdcheck.sweep.engine import Engine, SweepOptions
from pdcheck.sweep.schema import SweepInfo
from pdcheck.sweep.store import Provenance, create_run, load_run
from tests.fakes.openai_server import FakeOpenAIServer
from tests.unit.sweep.conftest import answering


def _timed(responder, times: list[float]):
    def respond(body):
        times.append(time.monotonic())
        return responder(body)

    return respond


class RecordingCpuBackend:
    """Fake servers with no GPUs: a URL per side and arm; records when each job's servers were up."""

    gpu_indices: tuple[int, ...] = ()

    def __init__(self, baseline_url: str, pd_urls: dict[str, str]):
        self.baseline_url, self.pd_urls = baseline_url, pd_urls
        self.up: dict[str, float] = {}
        self._lock = threading.Lock()

    def provenance(self, cell):
        return Provenance(vllm_version="sim")

    def _record(self, label: str) -> None:
        with self._lock:
            self.up[label] = time.monotonic()

    @contextlib.contextmanager
    def baseline(self, cell, *, gpus, cell_dir):
        self._record("baseline")
        yield Endpoints(baseline_url=self.baseline_url)

    @contextlib.contextmanager
    def pd(self, cell, *, gpus, cell_dir, prefill_key=None):
        self._record(cell.arm.name)
        yield Endpoints(pd_url=self.pd_urls[cell.arm.name])

    def close(self):
        pass


def test_a_cpu_wave_starts_its_servers_together_and_asks_one_job_at_a_time(
    sweep_file, gold_by_question, tmp_path
):
    """The baseline, the clean PD job and the canary (one prefill key) are one wave: every job's
    servers are up before the first question, the baseline is done before PD asks, the canary
    asks after the clean job, and it stops early against the baseline it waited for."""
    times: dict[str, list[float]] = {"baseline": [], "fixes-on": [], "inject-zero": []}
    right = answering(gold_by_question)
    with (
        FakeOpenAIServer(_timed(right, times["baseline"])) as base,
        FakeOpenAIServer(_timed(right, times["fixes-on"])) as clean,
        FakeOpenAIServer(
            _timed(answering(gold_by_question, wrong=True), times["inject-zero"])
        ) as canary,
    ):
        backend = RecordingCpuBackend(base.url, {"fixes-on": clean.url, "inject-zero": canary.url})
        store = create_run(
            tmp_path / "r",
            provenance=Provenance(),
            sweep=SweepInfo(name="fake", file="fake.yaml", sha256="x"),
            environment={},
        )
        events = []
        Engine(
            expand_cells(load_sweep(sweep_file)),
            store=store,
            backend=backend,
            options=SweepOptions(early_stop=True),
            on_event=events.append,
        ).run()

    assert "1 waves" in events[0].message
    assert max(backend.up.values()) < min(min(t) for t in times.values()), (
        "every job of the wave had its servers before any question was asked"
    )
    assert max(times["baseline"]) < min(times["fixes-on"])
    assert max(times["fixes-on"]) < min(times["inject-zero"])
    (canary_cell,) = [c for c in load_run(store.root).cells if c.canary]
    assert len(times["inject-zero"]) < 16, "the canary stopped early against its baseline"
    assert {v.verdict.verdict for v in canary_cell.verdicts.values()} == {Verdict.REGRESSION}
