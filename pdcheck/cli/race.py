"""`pdcheck race`."""

from pdcheck.cli._common import not_built

race = not_built("race", "Race harness")
trace = not_built("trace", "Race harness")
