"""Load a sweep file: YAML in, a validated `SweepSpec` out, or an error naming file, line and key."""

from __future__ import annotations

import difflib
import re
import typing
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError
from pydantic_core import ErrorDetails

from pdcheck.config.cells import expand_cells
from pdcheck.config.paths import shipped_dir
from pdcheck.config.schema import UNION_TAGS, SweepSpec
from pdcheck.config.selectors import selector_problem
from pdcheck.errors import ConfigError, SweepFileError, SweepFileErrors

# A key path into the sweep file, as pydantic reports it: mapping keys and list indices.
Loc = tuple[str | int, ...]

# The sweeps shipped with pdcheck, by bare name (`pdcheck sweep cpu-smoke`).
SWEEPS_DIR = shipped_dir("sweeps")


def shipped_sweep_names() -> list[str]:
    return sorted(p.stem for p in SWEEPS_DIR.glob("*.yaml")) if SWEEPS_DIR.is_dir() else []


def resolve_sweep_path(name_or_path: str | Path) -> Path:
    """A path names the user's file; a bare name (`pr`, `pr.yaml`) not found as a file names a shipped sweep."""
    path = Path(name_or_path)
    if path.is_file():
        return path
    if len(path.parts) == 1:
        shipped = SWEEPS_DIR / f"{path.name.removesuffix('.yaml')}.yaml"
        if shipped.is_file():
            return shipped
    raise SweepFileError(
        f"no such sweep file; shipped sweeps: {', '.join(shipped_sweep_names()) or 'none'} "
        "(name one bare, or give a path to your own file)",
        path=str(name_or_path),
    )


def load_sweep(path: str | Path) -> SweepSpec:
    path = resolve_sweep_path(path)
    text = _read_text(path)
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = mark.line + 1 if mark is not None else None
        problem = getattr(exc, "problem", None) or str(exc)
        raise SweepFileError(f"YAML syntax error: {problem}", path=str(path), line=line) from None
    except RecursionError:
        raise SweepFileError("YAML nested too deeply to read", path=str(path)) from None
    if not isinstance(data, dict):
        raise SweepFileError(
            "a sweep file must be a mapping at the top level", path=str(path), line=1
        )
    spec = parse_sweep(data, source=str(path), node=node)
    # A file whose include/exclude rules leave no cells, or give one cell twice, is wrong too.
    try:
        expand_cells(spec)
    except ConfigError as exc:
        raise SweepFileError(str(exc), path=str(path)) from None
    return spec


def _read_text(path: Path) -> str:
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise SweepFileError(f"cannot be read ({exc.strerror})", path=str(path)) from None
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw.count(b"\n", 0, exc.start) + 1
        raise SweepFileError(
            f"not UTF-8 text (byte {raw[exc.start]:#04x}); a sweep file is UTF-8 YAML",
            path=str(path),
            line=line,
        ) from None


def parse_sweep(
    data: dict[str, Any], *, source: str = "<sweep>", node: yaml.Node | None = None
) -> SweepSpec:
    """A validated spec, or a `SweepFileError` naming every problem (each with line and key path)."""
    try:
        spec = SweepSpec.model_validate(data)
    except ValidationError as exc:
        problems = []
        seen: set[tuple[Loc, str]] = set()
        for err in exc.errors():
            # An unknown key is the user's own text, kept even when it looks like a branch name.
            raw = err["loc"]
            loc = (
                _clean_loc(raw[:-1]) + raw[-1:]
                if err["type"] == "extra_forbidden"
                else _clean_loc(raw)
            )
            msg = _explain(err, loc)
            if (loc, msg) in seen:
                continue
            seen.add((loc, msg))
            key = ".".join(str(p) for p in loc) or None
            line = _line_of(node, loc) if node is not None else None
            problems.append(SweepFileError(msg, path=source, line=line, key=key))
        problems.sort(key=lambda p: p.line or 0)
        raise (problems[0] if len(problems) == 1 else SweepFileErrors(problems)) from None
    problem = _cross_reference_problem(spec)
    if problem is not None:
        loc, msg = problem
        line = _line_of(node, loc) if node is not None else None
        raise SweepFileError(msg, path=source, line=line, key=".".join(map(str, loc)))
    return spec


def _cross_reference_problem(spec: SweepSpec) -> tuple[Loc, str] | None:
    """Checks that span sections: arm names unique, environments that arms name exist, and each
    include/exclude selector names cell fields and matches a cell (`selectors.py`)."""
    env_names = [e.name for e in spec.environments]
    for i, env in enumerate(spec.environments):
        if env_names.count(env.name) > 1:
            return ("environments", i, "name"), f"duplicate environment name {env.name!r}"
    seen: set[str] = set()
    for i, arm in enumerate(spec.matrix.arms):
        name = arm if isinstance(arm, str) else arm.name
        if name in seen:
            return ("matrix", "arms", i), f"duplicate arm name {name!r}; arm names must be unique"
        seen.add(name)
        if (
            not isinstance(arm, str)
            and arm.environment is not None
            and arm.environment not in env_names
        ):
            return (
                ("matrix", "arms", i, "environment"),
                f"arm {arm.name!r} names environment {arm.environment!r}, which is not defined; "
                f"defined environments: {', '.join(env_names) or 'none'}",
            )
    # After the arms: a selector's arm values are checked against the names found valid above.
    return selector_problem(spec)


def _clean_loc(loc: Loc) -> Loc:
    # pydantic adds union-branch names such as "str" or "ArmSpec" to the path; keep real keys.
    branch_names = {"str", "int", "bool", "none", "float", *UNION_TAGS}
    return tuple(p for p in loc if not (isinstance(p, str) and (p in branch_names or "[" in p)))


def _explain(err: ErrorDetails, loc: Loc) -> str:
    kind = err["type"]
    if kind == "extra_forbidden":
        allowed = _allowed_keys(loc[:-1])
        close = difflib.get_close_matches(str(loc[-1]), allowed, n=1, cutoff=0.6)
        hint = f"did you mean {close[0]!r}? " if close else ""
        listed = f"allowed here: {', '.join(allowed)} " if allowed else ""
        return f"unknown key; {hint}{listed}(docs/sweep-files.md)"
    if kind == "missing":
        return "required key is missing"
    if kind == "literal_error":
        allowed = re.findall(r"'([^']*)'", str(err.get("ctx", {}).get("expected", "")))
        close = difflib.get_close_matches(str(err.get("input")), allowed, n=1, cutoff=0.6)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        return f"invalid value {err.get('input')!r}; {err['msg'].lower()}{hint}"
    if kind in ("greater_than", "greater_than_equal") and err.get("ctx", {}).get("gt") == 0:
        return f"must be a positive integer, got {err.get('input')!r}"
    msg = err["msg"]
    if msg.startswith("Value error, "):
        msg = msg[len("Value error, ") :]
    return f"{msg} (got {err.get('input')!r})"


def _allowed_keys(loc: Loc) -> list[str]:
    """The keys the schema accepts in the mapping at `loc` (cleaned), found by walking the models' fields."""
    kind: Any = SweepSpec
    for part in loc:
        kind = _mapping_model(kind)
        if kind is None:
            return []
        if isinstance(part, int):
            continue  # `kind` was a list of models: the element is that model
        field = kind.model_fields.get(str(part))
        if field is None:
            return []
        kind = field.annotation
    model = _mapping_model(kind)
    return list(model.model_fields) if model is not None else []


def _mapping_model(kind: Any) -> type[BaseModel] | None:
    """The one pydantic model inside an annotation (through Annotated, unions, tuples and lists)."""
    if isinstance(kind, type) and issubclass(kind, BaseModel):
        return kind
    models = {m for arg in typing.get_args(kind) if (m := _mapping_model(arg)) is not None}
    return models.pop() if len(models) == 1 else None


def _line_of(node: yaml.Node | None, loc: Loc) -> int | None:
    """Walk the composed YAML tree along the error path; return the deepest line found (1-based)."""
    line = node.start_mark.line + 1 if node is not None else None
    for part in loc:
        if isinstance(node, yaml.MappingNode):
            nxt = None
            for k, v in node.value:
                if k.value == str(part):
                    nxt = v
                    line = k.start_mark.line + 1
                    break
            if nxt is None:
                return line
            node = nxt
        elif (
            isinstance(node, yaml.SequenceNode) and isinstance(part, int) and part < len(node.value)
        ):
            node = node.value[part]
            line = node.start_mark.line + 1
        else:
            return line
    return line
