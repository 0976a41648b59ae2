"""`pdcheck compare`."""

from pdcheck.cli._common import not_built

compare = not_built("compare", "Analysis")
