"""The engine on CPU: a wave's servers start together, and its jobs' evals take turns in plan order."""

from __future__ import annotations

import asyncio
import contextlib
import re
import shutil
import threading
import time

from pdcheck.analysis.verdict import Verdict
from pdcheck.config import expand_cells, load_sweep
from pdcheck.results.schema import SweepInfo
from pdcheck.results.store import Provenance, create_run, load_run
from pdcheck.serving import Endpoints
from pdcheck.sweep.engine import Engine, SweepOptions
from tests.fakes.openai_server import FakeOpenAIServer
from tests.unit.sweep.conftest import LIMIT, answering


def _timed(responder, times: list[float]):
    def respond(body):
        times.append(time.monotonic())
        return responder(body)

    return respond


def _slow_after(responder, requests: int, delay_s: float):
    """`responder`, answering each request after the first `requests` only after `delay_s`."""
    seen = 0

    async def respond(body):
        nonlocal seen
        seen += 1
        if seen > requests:
            await asyncio.sleep(delay_s)
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


def _asked_at(server: FakeOpenAIServer, times: list[float]) -> dict[int, list[float]]:
    """When each question was asked, by concurrency level (from its X-Request-Id run tag)."""
    levels: dict[int, list[float]] = {}
    for headers, at in zip(server.headers, times, strict=True):
        level = int(
            re.search(
                r"-c(\d+)-r", {k.lower(): v for k, v in headers.items()}["x-request-id"]
            ).group(1)
        )
        levels.setdefault(level, []).append(at)
    return levels


def test_a_cpu_wave_starts_its_servers_together_and_asks_one_level_behind(
    sweep_file, gold_by_question, tmp_path
):
    """The baseline, the clean PD job and the canary (one prefill key) are one wave: every job's
    servers are up while the baseline still asks its c1 (not one job after another), and each job asks at a level once the job before
    it is done with that level, so the canary stops early against its baseline, and the clean
    job's c1 runs beside the baseline's c4."""
    times: dict[str, list[float]] = {"baseline": [], "fixes-on": [], "inject-zero": []}
    right = answering(gold_by_question)
    with (
        # The baseline answers its c4 (after c1's preflight and questions) slowly, so that it
        # outlasts the clean job's wake-up, and its c1 not at once, so that the other jobs'
        # servers come up meanwhile.
        FakeOpenAIServer(
            _slow_after(_timed(right, times["baseline"]), 1 + LIMIT, 0.05), delay_s=0.01
        ) as base,
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
    asked = {
        "baseline": _asked_at(base, times["baseline"]),
        "fixes-on": _asked_at(clean, times["fixes-on"]),
        "inject-zero": _asked_at(canary, times["inject-zero"]),
    }
    assert max(backend.up.values()) < max(asked["baseline"][1]), (
        "every job of the wave had its servers while the baseline still asked its c1"
    )
    for level in (1, 4):
        assert max(asked["baseline"][level]) < min(asked["fixes-on"][level])
    assert max(asked["fixes-on"][1]) < min(asked["inject-zero"][1])
    assert min(asked["fixes-on"][1]) < max(asked["baseline"][4]), (
        "the clean job's c1 did not wait for the baseline's c4"
    )
    (canary_cell,) = [c for c in load_run(store.root).cells if c.canary]
    assert len(times["inject-zero"]) < 16, "the canary stopped early against its baseline"
    assert 4 not in asked["inject-zero"], "its c4 carries the c1 verdict"
    assert {v.verdict.verdict for v in canary_cell.verdicts.values()} == {Verdict.REGRESSION}


def test_a_resumed_wave_does_not_wait_for_levels_done_in_the_earlier_run(
    sweep_file, gold_by_question, tmp_path
):
    """Resuming with the baseline's c1 done and its c4 not: the PD jobs' c1 asks at once,
    beside the baseline's c4, instead of waiting for the baseline job to end."""
    store = create_run(
        tmp_path / "r",
        provenance=Provenance(),
        sweep=SweepInfo(name="fake", file="fake.yaml", sha256="x"),
        environment={},
    )
    cells = expand_cells(load_sweep(sweep_file))
    right = answering(gold_by_question)
    with FakeOpenAIServer(right) as base, FakeOpenAIServer(right) as pd:
        urls = {"fixes-on": pd.url, "inject-zero": pd.url}
        Engine(cells, store=store, backend=RecordingCpuBackend(base.url, urls)).run()
    # What a sweep killed during the baseline's c4 leaves: c1 done, nothing else.
    for cell_dir in (store.root / "cells").iterdir():
        shutil.rmtree(cell_dir / "baseline" / "c4")
        shutil.rmtree(cell_dir / "pd")
        shutil.rmtree(cell_dir / "verdicts", ignore_errors=True)

    times: dict[str, list[float]] = {"baseline": [], "pd": []}
    with (
        FakeOpenAIServer(_timed(right, times["baseline"]), delay_s=0.05) as base,
        FakeOpenAIServer(_timed(right, times["pd"])) as pd,
    ):
        urls = {"fixes-on": pd.url, "inject-zero": pd.url}
        Engine(cells, store=store, backend=RecordingCpuBackend(base.url, urls)).run()
        asked = {"baseline": _asked_at(base, times["baseline"]), "pd": _asked_at(pd, times["pd"])}
    assert set(asked["baseline"]) == {4}, "only the missing baseline level is asked"
    assert min(asked["pd"][1]) < max(asked["baseline"][4])
    assert min(asked["pd"][4]) > max(asked["baseline"][4])
