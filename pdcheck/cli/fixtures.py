"""`pdcheck fixtures`."""

from pdcheck.cli._common import not_built

fixtures = not_built("fixtures", "Foundation")
