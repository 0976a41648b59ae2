"""JSON round-trip for the analysis result dataclasses: `to_dict()` and `from_dict()` in one place.

The sweep stores every result as JSON and the report reads it back, so each result type must
survive `from_dict(to_dict(x)) == x`. Nested dataclasses, tuples of them, optional values,
StrEnums and dicts with int keys (JSON turns them into strings) are rebuilt from the type hints.
"""

from __future__ import annotations

import dataclasses
import enum
import types
import typing
from typing import Any, TypeVar

T = TypeVar("T")


def _encode(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _encode(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, (tuple, list)):
        return [_encode(v) for v in value]
    if isinstance(value, dict):
        return {str(k) if isinstance(k, int) else k: _encode(v) for k, v in value.items()}
    return value


def _decode(hint: Any, value: Any) -> Any:
    if value is None:
        return None
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        non_none = [a for a in args if a is not type(None)]
        return _decode(non_none[0], value) if len(non_none) == 1 else value
    if origin is tuple:
        item = args[0] if args else Any
        return tuple(_decode(item, v) for v in value)
    if origin is dict:
        key_t, val_t = args
        return {(int(k) if key_t is int else k): _decode(val_t, v) for k, v in value.items()}
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):
        return from_dict(hint, value)
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        return hint(value)
    if hint is float and isinstance(value, int):
        return float(value)
    return value


def to_dict(obj: Any) -> dict[str, Any]:
    """A JSON-able dict of a result dataclass (enums by value, tuples as lists)."""
    return _encode(obj)


def from_dict(cls: type[T], data: dict[str, Any]) -> T:
    """Rebuild `cls` from `to_dict` output; unknown keys are ignored so older readers keep working."""
    hints = typing.get_type_hints(cls)
    kwargs = {
        f.name: _decode(hints[f.name], data[f.name])
        for f in dataclasses.fields(cls)
        if f.name in data
    }
    return cls(**kwargs)


class Serializable:
    """Mixin giving a frozen result dataclass its `to_dict()` and `from_dict()`."""

    def to_dict(self) -> dict[str, Any]:
        return to_dict(self)

    @classmethod
    def from_dict(cls: type[T], data: dict[str, Any]) -> T:
        return from_dict(cls, data)
