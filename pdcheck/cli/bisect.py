"""`pdcheck bisect`."""

from pdcheck.cli._common import not_built

bisect = not_built("bisect", "Bisect")
