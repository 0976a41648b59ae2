"""pytest plugin: `pytest --pdcheck-sweep FILE` turns each sweep cell into a test item.

Options and hooks only; the sweep machinery is imported inside the hooks (xdist's plugin.py
shape), so loading this plugin costs nothing in test runs that do not use it. When the option
is given, the sweep's cells replace the collected tests (the other items are deselected).
"""

from __future__ import annotations

from pathlib import Path


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


def pytest_configure(config) -> None:
    config.addinivalue_line("markers", "pdcheck_cell: a pdcheck sweep cell run as a test item")
    if config.getoption("pdcheck_only") and not config.getoption("pdcheck_sweep"):
        import pytest

        raise pytest.UsageError("--pdcheck-only needs --pdcheck-sweep FILE")
    if (config.getoption("pdcheck_baseline_url") is None) != (
        config.getoption("pdcheck_pd_url") is None
    ):
        import pytest

        raise pytest.UsageError(
            "attach mode needs both --pdcheck-baseline-url and --pdcheck-pd-url"
        )
    if config.getoption("pdcheck_sweep"):
        import pytest

        from pdcheck.config import load_sweep
        from pdcheck.errors import ConfigError

        try:  # a bad file stops the session here, before collection starts anything
            load_sweep(config.getoption("pdcheck_sweep"))
        except ConfigError as exc:
            raise pytest.UsageError(f"--pdcheck-sweep: {exc}") from None


def pytest_collection_modifyitems(session, config, items) -> None:
    sweep = config.getoption("pdcheck_sweep")
    if not sweep:
        return
    from pdcheck.config import resolve_sweep_path
    from pdcheck.sweep.pytest_items import SweepFile

    path = Path(resolve_sweep_path(sweep)).resolve()
    cells = list(SweepFile.from_parent(session, path=path).collect())
    if items:
        config.hook.pytest_deselected(items=list(items))
    items[:] = cells


def pytest_sessionfinish(session, exitstatus) -> None:
    if not session.config.getoption("pdcheck_sweep"):
        return
    from pdcheck.report import render_markdown
    from pdcheck.sweep.pytest_items import finish_session

    finish_session(session.config, render_report=render_markdown)
