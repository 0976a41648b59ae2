"""One CLI dialect: `--json` prints JSON on stdout, `--out FILE` writes it, a cell is `--only`,
the dry run's argv check is on by default, and the old spellings still work for one release with
one deprecation line on stderr."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

import pdcheck.cli.compare
import pdcheck.cli.doctor
import pdcheck.cli.race
import pdcheck.cli.serve
import pdcheck.race
import pdcheck.race.trace_check
from pdcheck.cli import cli
from pdcheck.errors import ExitCode
from pdcheck.race import DEFAULT_VARIANTS, VARIANTS, RaceSummary, TraceCheckResult

DEPRECATED = "is deprecated and goes in the next release"


@pytest.fixture
def race_runs(monkeypatch) -> list[dict]:
    """The harness as a double: records what it was asked, finds nothing."""
    calls: list[dict] = []

    def run_race(**kwargs):
        calls.append(kwargs)
        return RaceSummary("0.0-test", (), (), None, kwargs["seeds"], 0, 1, None, ())

    monkeypatch.setattr(pdcheck.race, "run_race", run_race)
    return calls


@pytest.fixture
def clean_trace(monkeypatch) -> None:
    result = TraceCheckResult("traces", files=1, segments=1, steps=3, num_findings=0, findings=())
    monkeypatch.setattr(pdcheck.race.trace_check, "check_trace_dir", lambda directory: result)


def _invoke(*args: str):
    # Wide, so that help text is not wrapped at a variant name's hyphen.
    return CliRunner().invoke(cli, list(args), terminal_width=400, max_content_width=400)


def test_race_json_prints_the_summary_on_stdout_and_nothing_else(race_runs):
    result = _invoke("race", "--seeds", "2", "--json")
    assert result.exit_code == ExitCode.OK, result.output
    assert json.loads(result.stdout)["seeds"] == 2
    assert DEPRECATED not in result.stderr


@pytest.mark.parametrize(
    ("option", "deprecation"),
    [("--out", []), ("--json", [f"pdcheck: --json FILE {DEPRECATED}; use --out FILE"])],
)
def test_race_writes_the_json_file_and_keeps_the_table(race_runs, tmp_path, option, deprecation):
    """`--out FILE`, and its old spelling `--json FILE` with one deprecation line."""
    out = tmp_path / "race.json"
    result = _invoke("race", option, str(out))
    assert result.exit_code == ExitCode.OK, result.output
    assert json.loads(out.read_text())["vllm_version"] == "0.0-test"
    assert "pdcheck race: vLLM 0.0-test" in result.stdout
    assert [line for line in result.stderr.splitlines() if DEPRECATED in line] == deprecation


def test_race_refuses_the_file_given_twice(race_runs, tmp_path):
    result = _invoke("race", "--json", str(tmp_path / "a.json"), "--out", str(tmp_path / "b"))
    assert result.exit_code != ExitCode.OK
    assert "give the file once, as --out FILE" in result.output
    assert race_runs == []


def test_trace_check_speaks_the_same_dialect(clean_trace, tmp_path):
    printed = _invoke("trace", "check", "traces", "--json")
    assert printed.exit_code == ExitCode.OK and json.loads(printed.stdout)["steps"] == 3
    out = tmp_path / "trace.json"
    old = _invoke("trace", "check", "traces", "--json", str(out))
    assert old.exit_code == ExitCode.OK and json.loads(out.read_text())["steps"] == 3
    assert f"--json FILE {DEPRECATED}; use --out FILE" in old.stderr


def test_race_help_lists_every_variant_from_where_they_are_defined():
    result = _invoke("race", "--help")
    assert result.exit_code == ExitCode.OK
    assert f"{', '.join(VARIANTS)}; 'all' for every one" in result.stdout
    assert f"Default: {', '.join(DEFAULT_VARIANTS)}." in result.stdout


def test_race_refuses_a_variant_it_does_not_define(race_runs):
    result = _invoke("race", "--variant", "atention")
    assert result.exit_code != ExitCode.OK and "'atention' is not one of" in result.output
    assert race_runs == []


@pytest.fixture
def argv_checks(monkeypatch) -> list[list[list[str]]]:
    """vLLM's argv check as a double (it runs in a child): every argv 'needs --fix-me'."""

    calls: list[list[list[str]]] = []

    def check(argvs, python):
        calls.append(argvs)
        return [["--fix-me"] for _ in argvs]

    monkeypatch.setattr(pdcheck.cli.serve, "check_serve_argvs", check)
    return calls


UP = ("up", "cpu-smoke", "--dry-run")
CELL = "tiny-llama-p1x1-d1x1-sync-fixes-on"


def test_up_picks_a_cell_with_only_and_checks_argv_by_default(argv_checks, tmp_path):
    result = _invoke(*UP, "--only", CELL, "--run-dir", str(tmp_path))
    assert result.exit_code == ExitCode.CONFIG  # the double's problem, one per server
    assert len(argv_checks) == 1 and result.stderr.count("--fix-me") == len(argv_checks[0]) == 3
    assert DEPRECATED not in result.stderr


def test_up_no_check_argv_skips_the_check(argv_checks, tmp_path):
    result = _invoke(*UP, "--only", CELL, "--no-check-argv", "--run-dir", str(tmp_path))
    assert result.exit_code == ExitCode.OK, result.output
    assert argv_checks == []


def test_up_cell_still_works_with_a_deprecation_line(argv_checks, tmp_path):
    result = _invoke(*UP, "--cell", CELL, "--no-check-argv", "--run-dir", str(tmp_path))
    assert result.exit_code == ExitCode.OK, result.output
    assert f"{CELL}" in result.stdout
    assert [line for line in result.stderr.splitlines() if DEPRECATED in line] == [
        f"pdcheck: --cell {DEPRECATED}; use --only"
    ]


def test_up_without_a_cell_names_only(capsys):
    from pdcheck.cli import main

    assert main(["up", "cpu-smoke", "--dry-run"]) == ExitCode.CONFIG
    assert "pick one with --only" in capsys.readouterr().err


@pytest.mark.parametrize(
    "command",
    [pdcheck.cli.compare.compare, pdcheck.cli.doctor.doctor, pdcheck.cli.race.race],
)
def test_json_alone_means_print_json_on_stdout_in_every_command(command):
    """`--json` takes no value in any command (the old `--json FILE` is an optional value)."""
    (option,) = [p for p in command.params if "--json" in p.opts]
    ctx = command.make_context(command.name, ["--json"], resilient_parsing=True)
    assert ctx.params[option.name] not in (None, False)
    assert "on stdout" in option.help or "instead of" in option.help
