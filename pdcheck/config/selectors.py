"""Check a sweep's include/exclude selectors against the cells the sweep could have.

A selector that matches no cell of the unfiltered product is a typo (`model: tiny-lama`,
`arm: inject-stael`): left alone it silently drops nothing, or keeps nothing, and the sweep runs
a different set of cells than its author meant. So each selector key must be one cells have,
each value one some cell takes, and the selector as a whole must match at least one cell.
"""

from __future__ import annotations

import difflib
import itertools
from collections.abc import Iterator
from typing import Any

from pdcheck.config.schema import SweepSpec

# Keys a selector (include/exclude) may use; `Cell.selector_values` reads each from a cell.
SELECTOR_KEYS = (
    "model",
    "kind",
    "prefill_tp",
    "decode_tp",
    "prefill_instances",
    "decode_instances",
    "async_scheduling",
    "arm",
    "attention_backend",
)

# A key path into the sweep file: mapping keys and list indices.
Loc = tuple[str | int, ...]


def selector_problem(spec: SweepSpec) -> tuple[Loc, str] | None:
    """The first selector that names an unknown key, or matches no cell of the unfiltered product,
    with its key path and a message that suggests the closest spelling; None when all match."""
    rows = list(_unfiltered_rows(spec))
    for which, selectors in (("include", spec.include), ("exclude", spec.exclude)):
        for i, selector in enumerate(selectors):
            problem = _check_one(selector, rows)
            if problem is not None:
                key, msg = problem
                return ((which, i, key) if key is not None else (which, i)), msg
    return None


def _check_one(
    selector: dict[str, Any], rows: list[dict[str, Any]]
) -> tuple[str | None, str] | None:
    for key in selector:
        if key not in SELECTOR_KEYS:
            return key, (
                f"unknown selector key {key!r}; {_did_you_mean(key, SELECTOR_KEYS)}"
                f"allowed: {', '.join(SELECTOR_KEYS)} (docs/sweep-files.md)"
            )
    for key, value in selector.items():
        taken = _distinct(row[key] for row in rows)
        if not any(_same(value, v) for v in taken):
            spelled = [_spell(v) for v in taken]
            return key, (
                f"{_spell(value)!r} matches no cell of the sweep; "
                f"{_did_you_mean(_spell(value), spelled)}"
                f"the sweep's cells have {key}: {', '.join(spelled)}"
            )
    if not any(all(_same(v, row[k]) for k, v in selector.items()) for row in rows):
        together = ", ".join(f"{k}: {_spell(v)}" for k, v in selector.items())
        return None, f"no cell of the sweep has {together} together; this selector matches nothing"
    return None


def _unfiltered_rows(spec: SweepSpec) -> Iterator[dict[str, Any]]:
    """The selector values of every cell of the product before include/exclude, as the matrix
    spells them (a CPU sweep's async values included: naming one is not a typo)."""
    m = spec.matrix
    arm_names = [a if isinstance(a, str) else a.name for a in m.arms]
    for model, ptp, dtp, pn, dn, asy, arm, backend in itertools.product(
        spec.models,
        m.prefill_tp,
        m.decode_tp,
        m.prefill_instances,
        m.decode_instances,
        m.async_scheduling,
        arm_names,
        m.attention_backend,
    ):
        yield {
            "model": model.name,
            "kind": model.kind,
            "prefill_tp": ptp,
            "decode_tp": dtp,
            "prefill_instances": pn,
            "decode_instances": dn,
            "async_scheduling": asy,
            "arm": arm,
            "attention_backend": backend,
        }


def _same(a: Any, b: Any) -> bool:
    # `True == 1` in Python; a selector's `decode_tp: true` is still a typo, so types must agree.
    return type(a) is type(b) and a == b


def _distinct(values: Iterator[Any]) -> list[Any]:
    out: list[Any] = []
    for v in values:
        if not any(_same(v, seen) for seen in out):
            out.append(v)
    return out


def _spell(value: Any) -> str:
    """A value as YAML writes it, so the message shows what to type."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _did_you_mean(word: str, allowed: list[str] | tuple[str, ...]) -> str:
    close = difflib.get_close_matches(word, list(allowed), n=1, cutoff=0.6)
    return f"did you mean {close[0]!r}? " if close else ""
