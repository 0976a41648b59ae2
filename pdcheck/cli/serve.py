"""`pdcheck serve`."""

from pdcheck.cli._common import not_built

up = not_built("up", "Serving")
proxy = not_built("proxy", "Serving")
