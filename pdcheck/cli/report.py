"""`pdcheck report`."""

from pdcheck.cli._common import not_built

report = not_built("report", "Reports and CI")
