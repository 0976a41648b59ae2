"""`python -m pdcheck` runs the CLI (used where a specific interpreter must run pdcheck)."""

from pdcheck.cli import run

run()
