"""pytest plugin: `pytest --pdcheck-sweep FILE` turns each sweep cell into a test item.

Options and hooks only; the sweep machinery is imported inside the hooks (xdist's plugin.py
shape), so loading this plugin costs nothing in test runs that do not use it. When the option
is given, the sweep's cells replace the collected tests (the other items are deselected).
"""

from __future__ import annotations

from pathlib import Path

from pdcheck.pytest_plugin.attach import attached_endpoints


def pytest_addoption(parser) -> None:
    group = parser.getgroup("pdcheck")
    group.addoption(
        "--pdcheck-sweep",
        action="store",
        default=None,
        metavar="FILE",
        help="Run each cell of this pdcheck sweep file as a test item.",
    )
    group.addoption(
        "--pdcheck-out",
        action="store",
        default=None,
        metavar="DIR",
        help="Results folder for --pdcheck-sweep (default pdcheck-results/<sweep>-pytest); "
        "cells already done there are not run again.",
    )
    group.addoption(
        "--pdcheck-only",
        action="append",
        default=None,
        metavar="NAME|ID",
        help="With --pdcheck-sweep: only these cells (repeatable).",
    )
    group.addoption(
        "--pdcheck-baseline-url",
        default=None,
        metavar="URL",
        help="Attach mode (with --pdcheck-pd-url): test one cell against servers you run.",
    )
    group.addoption(
        "--pdcheck-pd-url", default=None, metavar="URL", help="Attach mode: your PD endpoint."
    )
    group.addoption(
        "--pdcheck-decoder-metrics-url",
        action="append",
        default=None,
        metavar="URL",
        help="Attach mode: a decoder's /metrics (repeatable), scraped for KV evidence.",
    )


def pytest_configure(config) -> None:
    config.addinivalue_line("markers", "pdcheck_cell: a pdcheck sweep cell run as a test item")
    sweep = config.getoption("pdcheck_sweep")
    if config.getoption("pdcheck_only") and not sweep:
        import pytest

        raise pytest.UsageError("--pdcheck-only needs --pdcheck-sweep FILE")
    attach_given = any(
        config.getoption(name)
        for name in ("pdcheck_baseline_url", "pdcheck_pd_url", "pdcheck_decoder_metrics_url")
    )
    if not (sweep or attach_given):
        return
    import pytest

    from pdcheck.config import load_sweep
    from pdcheck.errors import ConfigError

    try:  # bad attach URLs stop the session here, before anything starts
        attached_endpoints(config)
    except ConfigError as exc:
        raise pytest.UsageError(str(exc)) from None
    try:  # so does a bad file, before collection
        if sweep:
            load_sweep(sweep)
    except ConfigError as exc:
        raise pytest.UsageError(f"--pdcheck-sweep: {exc}") from None


def pytest_collection_modifyitems(session, config, items) -> None:
    sweep = config.getoption("pdcheck_sweep")
    if not sweep:
        return
    from pdcheck.config import resolve_sweep_path
    from pdcheck.pytest_plugin.items import SweepFile

    path = Path(resolve_sweep_path(sweep)).resolve()
    cells = list(SweepFile.from_parent(session, path=path).collect())
    if attached_endpoints(config) is not None:
        import pytest

        from pdcheck.errors import ConfigError
        from pdcheck.sweep.run import check_attach_cells

        try:
            check_attach_cells([item.cell for item in cells], how_to_pick="--pdcheck-only NAME")
        except ConfigError as exc:
            raise pytest.UsageError(str(exc)) from None
    if items:
        config.hook.pytest_deselected(items=list(items))
    items[:] = cells


def pytest_sessionfinish(session, exitstatus) -> None:
    """Finish the run folder, and let the run's decision set the exit status.

    Items are judged as their cells finish, at alpha / F; the run's decision (Holm over every
    clean test, at finish) can flag a level whose item already passed. pytest then exits as
    `pdcheck sweep` would: 1 when the run failed, even if every item passed.
    """
    if not session.config.getoption("pdcheck_sweep"):
        return
    from pdcheck.pytest_plugin.items import finish_session

    code = finish_session(session.config)
    if code and session.exitstatus == 0:
        import pytest

        session.exitstatus = pytest.ExitCode.TESTS_FAILED
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        if reporter is not None:
            reporter.write_line(
                f"pdcheck: the run's decision fails (exit code {code} in summary.json): Holm "
                "across the clean tests flagged a level whose item passed; see report.md"
            )
