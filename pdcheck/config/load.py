"""Load a sweep file: YAML in, a validated `SweepSpec` out, or an error naming file, line and key."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from pdcheck.config.paths import shipped_dir
from pdcheck.config.schema import UNION_TAGS, SweepSpec
from pdcheck.errors import SweepFileError

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
    text = path.read_text()
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = mark.line + 1 if mark is not None else None
        problem = getattr(exc, "problem", None) or str(exc)
        raise SweepFileError(f"YAML syntax error: {problem}", path=str(path), line=line) from None
    if not isinstance(data, dict):
        raise SweepFileError("a sweep file must be a mapping at the top level", path=str(path), line=1)
    return parse_sweep(data, source=str(path), node=node)


def parse_sweep(data: dict[str, Any], *, source: str = "<sweep>", node: yaml.Node | None = None) -> SweepSpec:
    try:
        spec = SweepSpec.model_validate(data)
    except ValidationError as exc:
        err = exc.errors()[0]
        loc = _clean_loc(err["loc"])
        key = ".".join(str(p) for p in loc) or None
        line = _line_of(node, loc) if node is not None else None
        more = len(exc.errors()) - 1
        msg = _explain(err)
        if more:
            msg += f" (and {more} more error{'s' if more > 1 else ''})"
        raise SweepFileError(msg, path=source, line=line, key=key) from None
    problem = _cross_reference_problem(spec)
    if problem is not None:
        loc, msg = problem
        line = _line_of(node, loc) if node is not None else None
        raise SweepFileError(msg, path=source, line=line, key=".".join(map(str, loc)))
    return spec


def _cross_reference_problem(spec: SweepSpec) -> tuple[tuple, str] | None:
    """Checks that span sections: arm names unique, environments that arms name exist."""
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
        if not isinstance(arm, str) and arm.environment is not None and arm.environment not in env_names:
            return (
                ("matrix", "arms", i, "environment"),
                f"arm {arm.name!r} names environment {arm.environment!r}, which is not defined; "
                f"defined environments: {', '.join(env_names) or 'none'}",
            )
    return None


def _clean_loc(loc: tuple) -> tuple:
    # pydantic adds union-branch names such as "str" or "ArmSpec" to the path; keep real keys.
    branch_names = {"str", "int", "bool", "none", "float", *UNION_TAGS}
    return tuple(p for p in loc if not (isinstance(p, str) and (p in branch_names or "[" in p)))


def _explain(err: dict) -> str:
    kind = err["type"]
    if kind == "extra_forbidden":
        return "unknown key; check the spelling against the sweep schema (docs/sweep-files.md)"
    if kind == "missing":
        return "required key is missing"
    if kind == "literal_error":
        return f"invalid value {err.get('input')!r}; {err['msg'].lower()}"
    if kind in ("greater_than", "greater_than_equal") and err.get("ctx", {}).get("gt") == 0:
        return f"must be a positive integer, got {err.get('input')!r}"
    msg = err["msg"]
    if msg.startswith("Value error, "):
        msg = msg[len("Value error, "):]
    return f"{msg} (got {err.get('input')!r})"


def _line_of(node: yaml.Node | None, loc: tuple) -> int | None:
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
        elif isinstance(node, yaml.SequenceNode) and isinstance(part, int) and part < len(node.value):
            node = node.value[part]
            line = node.start_mark.line + 1
        else:
            return line
    return line
