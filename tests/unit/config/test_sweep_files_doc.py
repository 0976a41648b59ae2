"""docs/sweep-files.md documents every key of the sweep file's schema: every unknown-key error
sends the reader there, so a key the doc lacks is one a user cannot learn about.

The schema is read from the pydantic models (walked through their fields), the doc from its YAML
blocks, so neither list is written twice and a new key fails here until the doc shows it.
"""

from __future__ import annotations

import re
import typing
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel

from pdcheck.config import parse_sweep
from pdcheck.config.schema import SweepSpec

DOC = Path(__file__).resolve().parents[3] / "docs" / "sweep-files.md"


def _models_in(annotation: Any) -> list[type[BaseModel]]:
    """The pydantic models inside an annotation (through Annotated, unions, tuples, Optional)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [m for arg in typing.get_args(annotation) for m in _models_in(arg)]


def schema_keys(model: type[BaseModel], prefix: str = "") -> set[str]:
    """Every key path the schema accepts, dotted, a list's items under their list's key."""
    keys: set[str] = set()
    for name, field in model.model_fields.items():
        path = f"{prefix}{name}"
        keys.add(path)
        for inner in _models_in(field.annotation):
            keys |= schema_keys(inner, f"{path}.")
    return keys


def _yaml_blocks(text: str) -> list[str]:
    return re.findall(r"```yaml\n(.*?)```", text, flags=re.S)


def _doc_keys(node: Any, prefix: str = "") -> set[str]:
    keys: set[str] = set()
    if isinstance(node, dict):
        for key, value in node.items():
            keys.add(f"{prefix}{key}")
            keys |= _doc_keys(value, f"{prefix}{key}.")
    elif isinstance(node, list):
        for item in node:
            keys |= _doc_keys(item, prefix)
    return keys


def test_schema_walk_finds_nested_and_list_keys():
    """The walk reaches keys inside optional sections and inside lists of definitions."""
    keys = schema_keys(SweepSpec)
    assert {"ray.placement", "eval.no_stop", "matrix.arms.inject_seed", "models.path"} <= keys


def test_every_schema_key_is_in_the_docs_yaml_examples():
    """Each key path of SweepSpec appears, under its parent, in a YAML block of the doc."""
    documented: set[str] = set()
    for block in _yaml_blocks(DOC.read_text()):
        documented |= _doc_keys(yaml.safe_load(block))
    missing = sorted(schema_keys(SweepSpec) - documented)
    assert not missing, f"keys of the sweep schema missing from {DOC.name}'s examples: {missing}"


def test_the_complete_example_is_a_valid_sweep():
    """The doc's complete example loads: a key it spells wrong would be caught here."""
    first = _yaml_blocks(DOC.read_text())[0]
    assert parse_sweep(yaml.safe_load(first), source=DOC.name).name == "my-sweep"
