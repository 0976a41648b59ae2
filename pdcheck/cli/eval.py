"""`pdcheck eval`."""

from pdcheck.cli._common import not_built

eval_cmd = not_built("eval", "GSM8K evaluation engine")
