"""The contract tier's fixtures: one cached CUDA build per checked vLLM version (PDCHECK_CONTRACT_VLLM)."""

from __future__ import annotations

import json

import pytest

from tests.contract.builds import Build, full_matrix, install, selected_versions


def pytest_generate_tests(metafunc):
    if "version" in metafunc.fixturenames:
        metafunc.parametrize("version", selected_versions(), scope="session")


@pytest.fixture(scope="session")
def build(version: str) -> Build:
    return install(version, own_torch=full_matrix())


def run_probe(build: Build, script: str, **env: str) -> dict:
    """Run one of this folder's probe scripts on the build; its JSON result."""
    proc = build.run([f"tests/contract/{script}"], **env)
    for line in proc.stdout.splitlines():
        if line.startswith("PDCHECK-CONTRACT "):
            return json.loads(line.removeprefix("PDCHECK-CONTRACT "))
    tail = "\n".join(proc.stderr.strip().splitlines()[-25:])
    pytest.fail(f"{script} did not run on vLLM {build.version} (exit {proc.returncode}):\n{tail}")


@pytest.fixture(scope="session")
def gpu_decisions(build: Build) -> dict:
    return run_probe(build, "probe_gpu_decisions.py")


@pytest.fixture(scope="session")
def names(build: Build) -> dict:
    return run_probe(build, "probe_names.py", VLLM_TARGET_DEVICE="cpu")
