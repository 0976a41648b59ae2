"""The serving backend keeps prefill servers up between PD jobs with the same prefill key, and only then.

Stand-in servers (tests/fakes/stub_server.py) replace vLLM; each writes its pids to a file, so
the tests count starts and check that nothing is left running.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import urllib.request

import pytest

from pdcheck.serving.gpus import GpuInventory
from pdcheck.serving.ports import default_allocator
from pdcheck.sweep.serving_backend import ServingBackend
from tests.fakes.stub_topology import STUB, alive, recorded_pids, wait_gone
from tests.unit.serving.conftest import make_cell


@pytest.fixture
def backend(tmp_path):
    made = ServingBackend(
        GpuInventory((), "none"),
        ports=default_allocator(),
        launcher=[sys.executable, STUB],
    )
    yield made
    made.close()


@pytest.fixture
def cell(tmp_path):
    (tmp_path / "pids").mkdir()
    return make_cell(
        matrix={"env": [{"STUB_PID_DIR": str(tmp_path / "pids")}]},
        serving={"platform": "cpu", "ready_timeout_s": 30},
    )


def _servers(tmp_path) -> dict[int, int]:
    """port -> server pid of every stand-in started so far."""
    return {int(f.stem): int(f.read_text().split()[0]) for f in (tmp_path / "pids").glob("*.pids")}


def _ask(url: str) -> str:
    req = urllib.request.Request(
        url + "/v1/completions",
        data=b'{"prompt": "Q", "max_tokens": 4}',
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=20) as resp:
        return json.loads(resp.read())["choices"][0]["text"]


def test_same_prefill_key_keeps_the_prefiller_and_restarts_only_the_decoder(
    backend, cell, tmp_path
):
    with backend.pd(cell, gpus=(), cell_dir=tmp_path / "a", prefill_key="k") as first:
        assert _ask(first.pd_url).startswith("stub ")
    after_first = _servers(tmp_path)
    assert len(after_first) == 2
    with backend.pd(cell, gpus=(), cell_dir=tmp_path / "b", prefill_key="k") as second:
        assert _ask(second.pd_url).startswith("stub ")
    after_second = _servers(tmp_path)
    assert len(after_second) == 3, "only a new decoder starts"
    (first_prefill,) = [pid for pid in after_first.values() if alive(pid)]
    assert alive(first_prefill), "the prefiller is held for a next job with the same key"

    with backend.pd(cell, gpus=(), cell_dir=tmp_path / "c", prefill_key="other") as third:
        assert _ask(third.pd_url).startswith("stub ")
    assert len(_servers(tmp_path)) == 5, "another prefill key starts its own prefiller"
    assert wait_gone([first_prefill]) == [], "the prefiller of the old key was stopped"

    backend.close()
    assert wait_gone(recorded_pids(tmp_path / "pids")) == []


def test_a_baseline_start_stops_the_held_prefiller_first(backend, cell, tmp_path):
    with backend.pd(cell, gpus=(), cell_dir=tmp_path / "a", prefill_key="k"):
        pass
    held = [pid for pid in _servers(tmp_path).values() if alive(pid)]
    with backend.baseline(cell, gpus=(), cell_dir=tmp_path / "b") as endpoints:
        assert wait_gone(held) == [], "cores (or GPUs) go back before the baseline starts"
        assert _ask(endpoints.baseline_url).startswith("stub ")


def test_without_a_key_or_after_a_failure_the_prefiller_stops_with_its_job(backend, cell, tmp_path):
    with backend.pd(cell, gpus=(), cell_dir=tmp_path / "a", prefill_key=None):
        pass
    assert wait_gone(recorded_pids(tmp_path / "pids")) == []

    with pytest.raises(RuntimeError, match="eval failed"):
        with backend.pd(cell, gpus=(), cell_dir=tmp_path / "b", prefill_key="k"):
            raise RuntimeError("eval failed")
    assert wait_gone(recorded_pids(tmp_path / "pids")) == [], "a failed job hands no server on"


def test_a_held_prefiller_that_died_is_replaced(backend, cell, tmp_path):
    with backend.pd(cell, gpus=(), cell_dir=tmp_path / "a", prefill_key="k"):
        pass
    (held,) = [pid for pid in _servers(tmp_path).values() if alive(pid)]
    os.killpg(held, signal.SIGKILL)
    assert wait_gone([held]) == []
    with backend.pd(cell, gpus=(), cell_dir=tmp_path / "b", prefill_key="k") as endpoints:
        assert _ask(endpoints.pd_url).startswith("stub ")
    assert len(_servers(tmp_path)) == 4, "a new prefiller and decoder"


def test_jobs_ending_together_leave_one_prefiller_held(backend, cell, tmp_path):
    """Two PD jobs of one GPU wave end in parallel: the last to end holds its prefiller and stops the other's."""
    with backend.pd(cell, gpus=(), cell_dir=tmp_path / "a", prefill_key="a") as outer:
        outer_servers = set(_servers(tmp_path).values())
        with backend.pd(cell, gpus=(), cell_dir=tmp_path / "b", prefill_key="b"):
            pass
        assert _ask(outer.pd_url).startswith("stub ")
    still_up = [pid for pid in _servers(tmp_path).values() if alive(pid)]
    assert len(still_up) == 1 and still_up[0] in outer_servers, (
        "only the last job's prefiller is held; none leaked"
    )
    backend.close()
    assert wait_gone(recorded_pids(tmp_path / "pids")) == []


def test_a_new_prefiller_and_its_decoder_start_together(backend, cell, tmp_path, monkeypatch):
    """No server is waited for before the decoder has started: a CPU start is mostly one
    process importing vLLM, so a prefiller started alone leaves the second core idle."""
    from pdcheck.serving import process, topology

    started: list[str] = []
    started_at_first_wait: list[str] = []
    real_start, real_wait = process.ServerProcess.start, topology.wait_all_ready

    def start(self):
        started.append(self.name)
        return real_start(self)

    def wait_all_ready(servers, *, timeout_s):
        if not started_at_first_wait:
            started_at_first_wait.extend(started)
        return real_wait(servers, timeout_s=timeout_s)

    monkeypatch.setattr(process.ServerProcess, "start", start)
    monkeypatch.setattr(topology, "wait_all_ready", wait_all_ready)
    with backend.pd(cell, gpus=(), cell_dir=tmp_path / "a", prefill_key="k") as endpoints:
        assert _ask(endpoints.url("pd")).startswith("stub ")
    assert sorted(started_at_first_wait) == ["decode-0", "prefill-0"]


def test_jobs_running_at_once_with_one_key_share_one_prefiller(backend, cell, tmp_path):
    """A CPU wave's PD jobs with one prefill key start together on one prefiller, each with its
    own decoder; when the last ends the prefiller is held."""
    with backend.pd(cell, gpus=(), cell_dir=tmp_path / "a", prefill_key="k") as first:
        with backend.pd(cell, gpus=(), cell_dir=tmp_path / "b", prefill_key="k") as second:
            assert len(_servers(tmp_path)) == 3, "one prefiller, two decoders"
            assert _ask(second.pd_url).startswith("stub ")
            prefill_pids = {
                s.pid for e in (first, second) for s in e.started.servers if s.role == "prefill"
            }
            assert len(prefill_pids) == 1, "both jobs' records name the one prefiller"
        assert _ask(first.pd_url).startswith("stub "), "the prefiller outlives the first to end"
    still_up = [pid for pid in _servers(tmp_path).values() if alive(pid)]
    assert len(still_up) == 1, "the shared prefiller is held, both decoders stopped"


def test_a_failed_job_hands_its_shared_prefiller_to_no_new_job(backend, cell, tmp_path):
    """A job fails while another uses the prefiller: the other keeps it to its end, no job
    joins it after, and it stops with its last user."""
    with backend.pd(cell, gpus=(), cell_dir=tmp_path / "a", prefill_key="k") as survivor:
        with pytest.raises(RuntimeError, match="eval failed"):
            with backend.pd(cell, gpus=(), cell_dir=tmp_path / "b", prefill_key="k"):
                raise RuntimeError("eval failed")
        assert _ask(survivor.pd_url).startswith("stub ")
        with backend.pd(cell, gpus=(), cell_dir=tmp_path / "c", prefill_key="k"):
            assert len(_servers(tmp_path)) == 5, "a job after the failure starts its own prefiller"
    backend.close()
    assert wait_gone(recorded_pids(tmp_path / "pids")) == []
