"""`pytest --pdcheck-sweep`: the session's exit status follows the run's decision (summary.json),
not only the items, which are judged as their cells finish."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from pdcheck.pytest_plugin import pytest_sessionfinish
from pdcheck.results import load_run
from tests.unit.report.conftest import CellPlan, write_run


def _session(root, exitstatus: int) -> SimpleNamespace:
    options = {"pdcheck_sweep": "cpu-smoke", "pdcheck_out": str(root)}
    config = SimpleNamespace(
        getoption=options.get,
        pluginmanager=SimpleNamespace(get_plugin=lambda name: None),
    )
    return SimpleNamespace(config=config, exitstatus=exitstatus)


def test_a_failed_run_fails_the_session_even_if_every_item_passed(tmp_path):
    """A run whose summary says exit 1 (a REGRESSION) turns pytest's exit status 0 into 1
    (issue 30: Holm at finish could add REGRESSIONs to summary.json and pytest still passed)."""
    root = write_run(tmp_path / "run", [CellPlan("fixes-on", model="tiny-llama", drops={1: 60})])
    session = _session(root, exitstatus=0)
    pytest_sessionfinish(session, 0)
    summary = load_run(root).summary
    assert summary is not None and summary.exit_code == 1
    assert session.exitstatus == pytest.ExitCode.TESTS_FAILED


def test_a_clean_run_leaves_the_exit_status_alone(tmp_path):
    """A run whose decision passes does not change pytest's exit status."""
    root = write_run(tmp_path / "run", [CellPlan("fixes-on", model="tiny-llama")])
    session = _session(root, exitstatus=0)
    pytest_sessionfinish(session, 0)
    assert session.exitstatus == 0
