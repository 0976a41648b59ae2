"""One set of attach rules for `pdcheck sweep`, `pdcheck.sweep.run` and `pytest --pdcheck-sweep`:
each refuses the same bad URLs before anything starts, naming the value in its own spelling,
and each scrapes the decoder metrics URLs it is given."""

from __future__ import annotations

import pytest

from pdcheck.analysis.verdict import Verdict
from pdcheck.cli import main
from pdcheck.errors import ConfigError
from pdcheck.results import load_run
from pdcheck.serving import Endpoints
from pdcheck.sweep.run import SweepRequest, run_sweep
from tests.slow.test_pytest_plugin import _pytest

CLEAN = "fake-p1x1-d1x1-async-fixes-on"
GOOD = "http://127.0.0.1:9"

# (baseline, pd, decoder metrics) -> which input the error names, and what it says about it
BAD = {
    "pd only": ((None, GOOD, ()), "pd", "needs both"),
    "pd not a URL": ((GOOD, "localhost:8000", ()), "pd", "'localhost:8000' is not an http(s) URL"),
    "port out of range": ((GOOD, "http://h:99999", ()), "pd", "not an http(s) URL"),
    "metrics not a URL": ((GOOD, GOOD, ("10.0.0.7:8200",)), "metrics", "'10.0.0.7:8200' is not"),
    "metrics alone": ((None, None, (GOOD,)), "metrics", "is for attach mode"),
}
SPELLING = {
    "library": {"pd": "pd_url", "metrics": "decoder_metrics_urls"},
    "cli": {"pd": "--pd-url", "metrics": "--decoder-metrics-url"},
    "pytest": {"pd": "--pdcheck-pd-url", "metrics": "--pdcheck-decoder-metrics-url"},
}


def _options(prefix: str, baseline, pd, metrics) -> list[str]:
    args = [] if baseline is None else [f"--{prefix}baseline-url", baseline]
    args += [] if pd is None else [f"--{prefix}pd-url", pd]
    for url in metrics:
        args += [f"--{prefix}decoder-metrics-url", url]
    return args


def _pytest_sweep(tmp_path, sweep_file, out, *attach, only=(CLEAN,)):
    only_args = [a for name in only for a in ("--pdcheck-only", name)]
    return _pytest(
        tmp_path, "--pdcheck-sweep", str(sweep_file), *only_args, "--pdcheck-out", str(out), *attach
    )


@pytest.mark.parametrize("case", list(BAD))
def test_library_and_cli_refuse_the_same_bad_attach_input(case, sweep_file, tmp_path, capsys):
    """The library raises ConfigError and the CLI exits 3, each naming the bad input as its user
    spelled it; no run folder is made."""
    (baseline, pd, metrics), which, says = BAD[case]
    request = SweepRequest(
        file=str(sweep_file),
        out=tmp_path / "lib",
        only=(CLEAN,),
        attach=Endpoints(baseline_url=baseline, pd_url=pd, decoder_metrics_urls=metrics),
    )
    with pytest.raises(ConfigError, match=SPELLING["library"][which]) as err:
        run_sweep(request)
    assert says in str(err.value)
    out = tmp_path / "cli"
    cli = ["sweep", str(sweep_file), "--out", str(out), "--only", CLEAN]
    assert main([*cli, *_options("", baseline, pd, metrics)]) == 3
    stderr = capsys.readouterr().err
    assert SPELLING["cli"][which] in stderr and says in stderr
    assert not (tmp_path / "lib").exists() and not out.exists()


@pytest.mark.parametrize("case", ["pd not a URL", "metrics alone"])
def test_pytest_plugin_refuses_the_same_bad_attach_input(case, sweep_file, tmp_path):
    """`pytest --pdcheck-sweep` stops at configure (exit 4) with the same rule, in its own spelling."""
    (baseline, pd, metrics), which, says = BAD[case]
    out = tmp_path / "r"
    proc = _pytest_sweep(tmp_path, sweep_file, out, *_options("pdcheck-", baseline, pd, metrics))
    assert proc.returncode == 4, proc.stdout + proc.stderr
    assert SPELLING["pytest"][which] in proc.stderr and says in proc.stderr
    assert not out.exists()


def test_pytest_plugin_attaches_to_one_cell_only(sweep_file, servers, tmp_path):
    """As with `pdcheck sweep`, attach mode with two cells selected is refused before any request."""
    base, good, _ = servers
    proc = _pytest_sweep(
        tmp_path, sweep_file, tmp_path / "r", *_options("pdcheck-", base.url, good.url, ()), only=()
    )
    assert proc.returncode == 4 and "exactly one cell" in proc.stderr, proc.stdout + proc.stderr
    assert "--pdcheck-only NAME" in proc.stderr
    assert base.requests == [] and good.requests == []


def test_every_entry_point_scrapes_the_decoder_metrics_it_is_given(sweep_file, servers, tmp_path):
    """The CLI and the pytest plugin both read the decoder's /metrics around each PD unit, and
    both judge by it: this fake decoder received no KV, so PD was bypassed (INFRA-ERROR)."""
    base, good, _ = servers
    metrics = f"{good.url}/metrics"
    cli = ["sweep", str(sweep_file), "--out", str(tmp_path / "cli"), "--only", CLEAN]
    assert main([*cli, *_options("", base.url, good.url, (good.url,))]) == 2
    attach = _options("pdcheck-", base.url, good.url, (good.url,))
    proc = _pytest_sweep(tmp_path, sweep_file, tmp_path / "pytest", *attach)
    assert proc.returncode == 1 and "1 failed" in proc.stdout, proc.stdout + proc.stderr
    for out in ("cli", "pytest"):
        cell = load_run(tmp_path / out).cells[0]
        assert {v.verdict.verdict for v in cell.verdicts.values()} == {Verdict.INFRA_ERROR}, out
        kv = cell.kv
        assert kv and all(k.metrics_urls == (metrics,) for k in kv.values()), (out, kv)
        assert all(len(k.decoders) == 1 for k in kv.values()), (out, kv)
