"""Sweep files: schema, loading with located errors, and expansion into cells."""

from pdcheck.config.cells import Cell, expand_cells, select_cells
from pdcheck.config.expectations import LevelExpectation, level_expectation
from pdcheck.config.load import load_sweep, parse_sweep, resolve_sweep_path
from pdcheck.config.paths import cache_dir, resolve_model_path
from pdcheck.config.schema import (
    SCHEMA_VERSION,
    AnalysisPolicy,
    ArmSpec,
    EvalSettings,
    ModelSpec,
    SweepSpec,
)

__all__ = [
    "SCHEMA_VERSION",
    "AnalysisPolicy",
    "ArmSpec",
    "Cell",
    "EvalSettings",
    "LevelExpectation",
    "ModelSpec",
    "SweepSpec",
    "cache_dir",
    "expand_cells",
    "level_expectation",
    "load_sweep",
    "parse_sweep",
    "resolve_model_path",
    "resolve_sweep_path",
    "select_cells",
]
