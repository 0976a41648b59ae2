"""pytest plugin: `pytest --pdcheck-sweep FILE` turns each sweep cell into a test item.

Options and hooks only; the sweep machinery is imported inside the hooks. Not built yet
(sweep engine issue): the option is declared so that pytest accepts it.
"""

from __future__ import annotations


def pytest_addoption(parser) -> None:
    group = parser.getgroup("pdcheck")
    group.addoption("--pdcheck-sweep", action="store", default=None, metavar="FILE",
                    help="Run each cell of this pdcheck sweep file as a test item.")
