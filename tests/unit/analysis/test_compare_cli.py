"""`pdcheck compare`: prints the analysis of two record files and exits with the verdict's code."""

from __future__ import annotations

import json

from click.testing import CliRunner

from pdcheck.cli import cli, main
from tests.unit.analysis.builders import injection_line, paired_sides, record, side


def _write(path, records):
    # One write, not a RecordWriter per line: a fsync per line would cost seconds for 1,000 records.
    path.write_text("".join(r.to_json() + "\n" for r in records))
    return str(path)


def _files(tmp_path, *, both, worse, better, neither):
    base, pd = paired_sides(both=both, worse=worse, better=better, neither=neither)
    return _write(tmp_path / "base.jsonl", base), _write(tmp_path / "pd.jsonl", pd)


def test_regression_exits_1_and_prints_tables(tmp_path):
    """A clear drop prints the tables and the REGRESSION line, and exits 1."""
    b, p = _files(tmp_path, both=700, worse=80, better=20, neither=200)
    result = CliRunner().invoke(cli, ["compare", b, p, "--early-stop"])
    assert result.exit_code == 1, result.output
    assert (
        "REGRESSION" in result.output
        and "Paired" in result.output
        and "Greedy agreement" in result.output
    )
    assert "early stop:" in result.output


def test_pass_exits_0(tmp_path):
    """A clean, well-powered run passes with exit 0."""
    b, p = _files(tmp_path, both=1000, worse=10, better=10, neither=300)
    result = CliRunner().invoke(cli, ["compare", b, p])
    assert result.exit_code == 0, result.output
    assert "PASS" in result.output


def test_inconclusive_fails_the_gate_unless_allowed(tmp_path):
    """Underpowered is not green: exit 1 and stderr says why; --allow-inconclusive exits 0 with a warning."""
    b, p = _files(tmp_path, both=20, worse=1, better=0, neither=5)
    result = CliRunner().invoke(cli, ["compare", b, p])
    assert result.exit_code == 1
    assert "INCONCLUSIVE" in result.output
    assert "error: INCONCLUSIVE, we could not tell" in result.stderr and "n ≥" in result.stderr
    allowed = CliRunner().invoke(cli, ["compare", b, p, "--allow-inconclusive"])
    assert allowed.exit_code == 0
    assert "warning: INCONCLUSIVE" in allowed.stderr


def test_infra_error_exits_2(tmp_path):
    """Files where no question succeeded on both sides give INFRA-ERROR, exit 2."""
    b = _write(tmp_path / "b.jsonl", side([True] * 10))
    p = _write(tmp_path / "p.jsonl", [record(i, correct=False, ok=False) for i in range(10)])
    assert CliRunner().invoke(cli, ["compare", b, p]).exit_code == 2


def test_json_output_round_trips(tmp_path):
    """--json prints one JSON document with the comparison and the verdict (options applied)."""
    b, p = _files(tmp_path, both=700, worse=30, better=20, neither=250)
    result = CliRunner().invoke(
        cli, ["compare", b, p, "--json", "--margin-pts", "0.5", "--alpha", "0.1"]
    )
    data = json.loads(result.stdout)
    assert data["verdict"]["margin_pts"] == 0.5 and data["verdict"]["alpha"] == 0.1
    assert data["comparison"]["worse"] == 30
    assert data["verdict"]["verdict"] in ("PASS", "REGRESSION", "INCONCLUSIVE")


def test_injection_precision_from_the_plugin_log(tmp_path):
    """--injections reads the plugin's injections.jsonl and scores divergent questions against it."""
    b = _write(tmp_path / "b.jsonl", [record(i, correct=True) for i in range(50)])
    p = _write(
        tmp_path / "p.jsonl",
        [record(i, correct=True, token_ids=(9, 9) if i < 5 else (1, 2, 3)) for i in range(50)],
    )
    log = tmp_path / "injections.jsonl"
    log.write_bytes(b"".join(injection_line(f"pd-c1-r0-q{i:05d}") for i in range(4)))
    result = CliRunner().invoke(cli, ["compare", b, p, "--injections", str(log), "--json"])
    got = json.loads(result.stdout)["injection_precision"]
    assert got["n_true_positive"] == 4 and got["n_flagged"] == 5 and got["recall"] == 1.0


def test_mismatched_files_exit_3_with_the_reason(tmp_path, capsys):
    """Files over different questions are bad input: exit 3 (config), and the message says why."""
    b = _write(tmp_path / "b.jsonl", side([True] * 5))
    p = _write(tmp_path / "p.jsonl", side([True] * 5, start=3))
    assert main(["compare", b, p]) == 3
    assert "different questions" in capsys.readouterr().err


def test_non_finite_options_exit_3(tmp_path):
    """NaN passes every range check and inf some: --margin-pts, --alpha and --tie-epsilon refuse
    both with exit 3 and a message naming the option (issue 30: a traceback and exit 1)."""
    b, p = _files(tmp_path, both=100, worse=0, better=0, neither=0)
    for option, value in (
        ("--margin-pts", "nan"),
        ("--alpha", "nan"),
        ("--tie-epsilon", "nan"),
        ("--tie-epsilon", "inf"),
        ("--margin-pts", "inf"),
    ):
        assert main(["compare", b, p, option, value]) == 3, (option, value)


def test_non_finite_option_message_names_the_option(tmp_path, capsys):
    """The exit-3 message says which option and what is allowed."""
    b, p = _files(tmp_path, both=100, worse=0, better=0, neither=0)
    assert main(["compare", b, p, "--alpha", "nan"]) == 3
    err = capsys.readouterr().err
    assert "--alpha" in err and "finite" in err


def test_pd_repeats_join_the_test(tmp_path):
    """--pd-repeat pairs with the --baseline-repeat at its position and its pairs join the test:
    a 3-point drop in each of two runs of 400 is flagged on the pooled 800 pairs, not on one."""
    base, pd = paired_sides(both=300, worse=16, better=4, neither=80)
    b = _write(tmp_path / "b.jsonl", base)
    p = _write(tmp_path / "p.jsonl", pd)
    b2 = _write(tmp_path / "b2.jsonl", base)
    p2 = _write(tmp_path / "p2.jsonl", pd)
    one = CliRunner().invoke(cli, ["compare", b, p, "--json", "--margin-pts", "0"])
    two = CliRunner().invoke(
        cli,
        [
            "compare",
            b,
            p,
            "--baseline-repeat",
            b2,
            "--pd-repeat",
            p2,
            "--json",
            "--margin-pts",
            "0",
        ],
    )
    assert json.loads(one.output)["comparison"]["n_pairs"] == 400
    pooled = json.loads(two.output)
    assert (pooled["comparison"]["n_pairs"], pooled["comparison"]["worse"]) == (800, 32)
    assert pooled["verdict"]["n_pairs"] == 800


def test_a_pd_repeat_without_its_own_baseline_repeat_exits_3(tmp_path):
    """A PD repeat pairs with a baseline run of its own (pairs sharing a baseline run are not
    independent): more --pd-repeat than --baseline-repeat is refused with exit 3."""
    b, p = _files(tmp_path, both=100, worse=0, better=0, neither=0)
    assert main(["compare", b, p, "--pd-repeat", p]) == 3


def test_no_drop_shown_warns_and_fails_only_when_asked(tmp_path):
    """A powered comparison whose drop is not bounded by the margin is NO-DROP-SHOWN, never PASS:
    exit 0 with a warning by default, 1 under --no-drop-shown-fails (issue 42)."""
    b, p = _files(tmp_path, both=1000, worse=30, better=12, neither=277)
    args = ["compare", b, p, "--alpha", str(0.05 / 24)]
    default = CliRunner().invoke(cli, args)
    assert default.exit_code == 0, default.output
    assert (
        "NO-DROP-SHOWN" in default.output
        and "warning: NO-DROP-SHOWN is not a PASS" in default.output
    )
    strict = CliRunner().invoke(cli, [*args, "--no-drop-shown-fails"])
    assert strict.exit_code == 1, strict.output
    assert "error: NO-DROP-SHOWN" in strict.output
