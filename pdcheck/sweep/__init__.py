"""Sweep: orchestration of cells and units into a results folder (`pdcheck.results`)."""
