"""`pdcheck sweep`."""

from pdcheck.cli._common import not_built

sweep = not_built("sweep", "Sweep engine")
merge = not_built("merge", "Sweep engine")
