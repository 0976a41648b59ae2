"""A decoder lost around a PD unit is reported as the server that died, also when the read of
its KV metrics is what notices first (a Ray node lost between the eval's last check and the
read showed "could not read decoder metrics" instead of the lost node)."""

from __future__ import annotations

import contextlib
import socket
from pathlib import Path

from pdcheck.config import expand_cells, load_sweep
from pdcheck.errors import ServerCrashed
from pdcheck.results.schema import FailureFile, SweepInfo, from_json
from pdcheck.results.store import Provenance, create_run
from pdcheck.serving import Endpoints
from pdcheck.sweep.engine import Engine, SweepOptions
from tests.unit.sweep.conftest import answering
from tests.unit.sweep.test_results_schema import FakeBackend


class DeadDecoder:
    """A started decoder that has exited: its check says so, as a real process's would."""

    name = "decode-0"

    def check_alive(self) -> None:
        raise ServerCrashed("decode-0", -9, "killed", "decode-0.log")


class LostDecoderBackend(FakeBackend):
    """The unit tests' fake servers, with a PD topology whose decoder has died."""

    def __init__(self, baseline_url: str, pd_url: str, metrics_url: str, plugin_dir: Path):
        super().__init__(baseline_url, pd_url, plugin_dir)
        self.metrics_url = metrics_url

    @contextlib.contextmanager
    def pd(self, cell, *, gpus, cell_dir, prefill_key=None):
        yield Endpoints(
            pd_url=self.pd_url,
            decoder_metrics_urls=(self.metrics_url,),
            processes=(DeadDecoder(),),  # type: ignore[arg-type]
        )


def _refusing_url() -> str:
    """A loopback URL nothing listens on: its connections are refused, as a dead server's are."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}"


def test_a_decoder_whose_metrics_no_longer_answer_fails_its_unit_as_the_crashed_server(
    sweep_file, gold_by_question, tmp_path
):
    from tests.fakes.openai_server import FakeOpenAIServer

    cells = expand_cells(load_sweep(sweep_file))[:1]
    with FakeOpenAIServer(answering(gold_by_question)) as server:
        store = create_run(
            tmp_path / "run",
            provenance=Provenance(vllm_version="0.32.0", vllm_commit="abc"),
            sweep=SweepInfo(name="fake", file=str(sweep_file), sha256="x"),
            environment={},
        )
        backend = LostDecoderBackend(server.url, server.url, _refusing_url(), tmp_path)
        engine = Engine(cells, store=store, backend=backend, options=SweepOptions())
        engine.execute()
    failures = [
        from_json(p.read_bytes(), FailureFile)
        for p in store.root.glob("cells/*/pd/**/failure.json")
    ]
    assert failures, "the PD unit must fail"
    assert {f.error_type for f in failures} == {"ServerCrashed"}, [f.message for f in failures]
    assert all("decode-0" in f.message for f in failures)
