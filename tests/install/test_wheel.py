"""pdcheck works as users install it: from the wheel, in a fresh venv, away from the repo.

The wheel and sdist are built from this checkout (no build isolation: the dev venv has the
build backend) unless $PDCHECK_DIST_DIR names ready ones, the wheel is installed with its core dependencies only (no vLLM, no torch)
into a new venv, and every command runs from an empty folder. The sweep results that
`report` and `merge` read are produced by the installed pdcheck itself, in attach mode
against fake OpenAI servers.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import tarfile
import textwrap
import zipfile
from pathlib import Path

import pytest

from tests.fakes.openai_server import FakeOpenAIServer
from tests.unit.sweep.conftest import answering

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = ("sweeps", "fixtures")
# One worker builds and installs once; the other worker goes on with the rest of the suite.
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("install")]


def _shipped_files() -> dict[str, bytes]:
    """`pdcheck/data/<folder>/<path>` -> bytes, for every file of the top-level sweeps/ and fixtures/."""
    return {
        f"pdcheck/data/{p.relative_to(ROOT).as_posix()}": p.read_bytes()
        for folder in SHIPPED
        for p in sorted((ROOT / folder).rglob("*"))
        if p.is_file()
    }


@pytest.fixture(scope="module")
def dist(tmp_path_factory) -> Path:
    """The sdist and wheel: $PDCHECK_DIST_DIR's (the release workflow's archives), else built here."""
    if given := os.environ.get("PDCHECK_DIST_DIR"):
        return Path(given)
    out = tmp_path_factory.mktemp("dist")
    subprocess.run(
        [sys.executable, "-m", "build", "--no-isolation", "--outdir", str(out), str(ROOT)],
        check=True,
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    return out


@pytest.fixture(scope="module")
def wheel(dist) -> Path:
    return next(dist.glob("*.whl"))


@pytest.fixture(scope="module")
def venv(tmp_path_factory, wheel) -> Path:
    """A new venv (not a copy of the dev one) with the wheel and its core dependencies only."""
    path = tmp_path_factory.mktemp("venv")
    base_python = getattr(sys, "_base_executable", sys.executable)
    # Without pip of its own (ensurepip takes seconds): this venv's pip installs into it.
    subprocess.run([base_python, "-m", "venv", "--without-pip", str(path)], check=True)
    # --no-compile: byte-compiling scipy, pandas and pyarrow is a third of the install's CPU time.
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "--python",
            str(path / "bin" / "python"),
            "install",
            "--quiet",
            "--disable-pip-version-check",
            "--no-compile",
            str(wheel),
        ],
        check=True,
        capture_output=True,
        text=True,
    )
    return path


@pytest.fixture(scope="module")
def pdcheck(venv, tmp_path_factory):
    """Run the installed `pdcheck` from an empty folder, with no path leading back to the repo."""
    empty = tmp_path_factory.mktemp("empty")
    # As tests/conftest.py's clean_environ does for in-process tests: the host's settings stay out.
    # PYTHONDONTWRITEBYTECODE too: pip compiles what a user installs, and this venv, installed
    # with --no-compile, gets the same bytecode for what pdcheck imports on its first run,
    # instead of compiling scipy, pandas and pyarrow again in every command (2-4 s each).
    host_only = (
        "PYTHONDONTWRITEBYTECODE",
        "PYTHONPATH",
        "PYTHONHOME",
        "VIRTUAL_ENV",
        "PDCHECK_",
        "VLLM_",
        "HF_",
        "CUDA_VISIBLE_DEVICES",
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith(host_only)}
    env.update(
        PDCHECK_CACHE_DIR=str(tmp_path_factory.mktemp("cache")), HF_HUB_OFFLINE="1", COLUMNS="200"
    )

    def run(*args: str, expect: int = 0, **extra_env: str) -> str:
        proc = subprocess.run(
            [str(venv / "bin" / "pdcheck"), *args],
            cwd=empty,
            env={**env, **extra_env},
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert proc.returncode == expect, (
            f"pdcheck {' '.join(args)}: exit {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
        )
        return proc.stdout + proc.stderr

    run.cwd = empty
    return run


def test_the_venv_has_no_vllm_and_no_view_of_the_repo(venv):
    """The installed package is the wheel's copy in the new venv, and vLLM and torch are absent."""
    code = (
        "import importlib.util, pdcheck; print(pdcheck.__file__); "
        "print([m for m in ('vllm', 'torch') if importlib.util.find_spec(m)])"
    )
    out = subprocess.run(
        [str(venv / "bin" / "python"), "-I", "-c", code],
        check=True,
        capture_output=True,
        text=True,
        cwd="/",
    ).stdout.splitlines()
    assert Path(out[0]).is_relative_to(venv) and out[1] == "[]"


def test_version_is_the_wheels(pdcheck, wheel):
    """`pdcheck --version` is the version the wheel was built with (from git)."""
    version = wheel.name.split("-")[1]
    assert pdcheck("--version").strip() == f"pdcheck, version {version}"


def test_shipped_sweeps_list_validate_and_dry_run_by_bare_name(pdcheck):
    """From an empty folder: --list shows every shipped sweep; `pr` validates and plans for 4 GPUs."""
    listing = pdcheck("sweep", "--list")
    for path in sorted((ROOT / "sweeps").glob("*.yaml")):
        assert path.stem in listing
    assert "4 cells" in pdcheck("validate", "pr")
    plan = pdcheck("sweep", "pr", "--dry-run", "--gpus", "4")
    assert "(gpu)" in plan and "vllm.entrypoints.cli.main serve Qwen/Qwen3-0.6B" in plan
    assert "argv not checked" in plan and "cannot import vllm" in plan
    assert "no such sweep file; shipped sweeps: cpu-smoke" in pdcheck(
        "validate", "sweeps/pr.yaml", expect=3
    )
    # No file: the default sweep for the GPUs found (none visible here) is a shipped one too.
    default = pdcheck("sweep", "--dry-run", CUDA_VISIBLE_DEVICES="")
    assert "using the shipped sweep cpu-smoke" in default and "# sweep cpu-smoke" in default


def test_tiny_models_install_from_the_wheel_and_match_the_manifest(pdcheck):
    """The trained models come out of the wheel byte for byte; the random ones need torch and say so (exit 2)."""
    manifest = json.loads((ROOT / "fixtures" / "manifest.json").read_text())["models"]
    trained = sorted(p.name for p in (ROOT / "fixtures" / "trained").iterdir())
    out = pdcheck.cwd / "models"
    pdcheck("fixtures", "tiny-models", "--out", str(out), *(f"--only={name}" for name in trained))
    for name in trained:
        files = {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in (out / name).iterdir()}
        assert files == manifest[name], name
    message = pdcheck("fixtures", "tiny-models", "--out", str(out), expect=2)
    assert "not built" in message and "pdcheck[train]" in message


def test_sweep_report_and_merge_run_from_the_wheel(pdcheck, tmp_path):
    """Sharded attach-mode runs by the installed pdcheck merge, and the merged folder renders as a report."""
    from pdcheck.config import EvalSettings, expand_cells, load_sweep
    from pdcheck.evals import load_task
    from pdcheck.sweep.run import shard_cells

    gold = {
        ex.question.strip(): ex.final_answer
        for ex in load_task(EvalSettings(task="gsm8k-synth")).test[:8]
    }
    sweep = tmp_path / "fake.yaml"
    sweep.write_text(
        textwrap.dedent("""\
        name: fake
        models: [{name: fake, path: /nonexistent/fake-model}]
        matrix: {arms: [fixes-on, {name: again}], concurrency: [2]}
        eval: {task: gsm8k-synth, limit: 8, max_tokens: 16}
        analysis: {margin_pts: 60}
        """)
    )
    cells = expand_cells(load_sweep(sweep))
    shards = []
    with FakeOpenAIServer(answering(gold)) as base, FakeOpenAIServer(answering(gold)) as pd:
        # Attach mode runs one cell at a time: each shard's cells, each into its own folder.
        for i in (1, 2):
            for cell in shard_cells(cells, (i, 2)):
                shards.append(tmp_path / f"shard-{i}-{cell.arm.name}")
                pdcheck(
                    "sweep",
                    str(sweep),
                    "--shard",
                    f"{i}/2",
                    "--only",
                    cell.name,
                    "--out",
                    str(shards[-1]),
                    "--baseline-url",
                    base.url,
                    "--pd-url",
                    pd.url,
                )
    pdcheck("merge", *map(str, shards), "--out", str(tmp_path / "merged"))
    report = pdcheck("report", str(tmp_path / "merged"), "--format", "md")
    assert all(cell.name in report for cell in cells)
    assert f"pdcheck: {pdcheck('--version').split()[-1]}" in report


def test_wheel_and_sdist_carry_every_shipped_file_and_no_tests(dist, wheel):
    """Every sweep and fixture is in both archives, byte for byte; no test or benchmark file is."""
    expected = _shipped_files()
    with zipfile.ZipFile(wheel) as whl:
        names = whl.namelist()
        assert {name: whl.read(name) for name in expected} == expected
    sdist = next(dist.glob("*.tar.gz"))
    # The wheel is built from the unpacked sdist (no .git there): its version came from PKG-INFO.
    assert sdist.name.removesuffix(".tar.gz").split("-", 1)[1] == wheel.name.split("-")[1]
    with tarfile.open(sdist) as tar:
        members = {m.name.split("/", 1)[1]: m for m in tar.getmembers() if "/" in m.name}
        assert {name: tar.extractfile(members[name]).read() for name in expected} == expected
    for listing in (names, list(members)):
        assert not [
            n for n in listing if n.startswith(("tests/", "benchmarks/")) or "/tests/" in n
        ], listing
        assert any(n.startswith("pdcheck/cli/") for n in listing)
