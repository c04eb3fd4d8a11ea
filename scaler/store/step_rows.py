"""A step as the store keeps it and as it is shown, derived from :data:`STEP_FIELDS`.

:func:`step_values` turns a :class:`StepRecord` into its ``steps`` row (after ``run_id``);
:func:`step_dict` turns a row read back into JSON-ready values.

>>> step_dict(step_values(StepRecord(step=3, wall_time=1.5, scale=2.0, overflow=True,
...     skipped=True, inf_ranks=(1,), scale_after=1.0, growth_tracker=0, growth_interval=2,
...     growth_factor=2.0, backoff_factor=0.5, control_version=0)))["inf_ranks"]
[1]
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from math import isfinite
from typing import Any

from .records import format_inf_ranks, format_lr_groups, parse_lr_groups
from .step_schema import STEP_FIELDS, Kind, StepField, StepRecord

__all__ = [
    "COLUMNS",
    "EXPORT_COLUMNS",
    "parse_ranks",
    "step_dict",
    "step_values",
    "values_function",
]

# The columns of ``steps`` after ``run_id``, in table order.
COLUMNS: tuple[str, ...] = tuple(f.name for f in STEP_FIELDS)
EXPORT_COLUMNS: tuple[str, ...] = tuple(f.export_name for f in STEP_FIELDS)

Convert = Callable[[Any], Any]


def _stored(f: StepField, value: str) -> str:
    """The expression of a field's column value, ``value`` being the field's own."""
    if f.kind is Kind.RANKS:
        return f'(format_inf_ranks({value}) if {value} else "")'
    if f.kind is Kind.FLOAT_GROUPS:
        return f"(None if {value} is None else format_lr_groups({value}))"
    if f.finite_only:
        return f"(v if (v := {value}) is None or isfinite(v) else None)"
    return value


def values_function(
    name: str,
    sources: Mapping[str, str],
    prologue: str = "",
    namespace: Mapping[str, Any] | None = None,
) -> Callable[[Any], tuple[Any, ...]]:
    """A function of one argument ``r`` that returns a ``steps`` row after its ``run_id``:
    each field's column value made of ``sources[field]``, a Python expression of ``r``
    (and of names ``prologue``, run first, binds).

    Written out as one expression, as dataclasses writes ``__init__``: the writer calls it
    for every step, and a loop over the fields took four times as long. The source is
    made of the declaration and of the caller's own expressions, never of input.
    """
    body = ", ".join(_stored(f, sources[f.name]) for f in STEP_FIELDS)
    source = f"def {name}(r):\n{prologue}    return ({body},)\n"
    scope: dict[str, Any] = {
        "format_inf_ranks": format_inf_ranks,
        "format_lr_groups": format_lr_groups,
        "isfinite": isfinite,
        **(namespace or {}),
    }
    exec(source, scope)
    function: Callable[[Any], tuple[Any, ...]] = scope[name]
    return function


def _record_values() -> Callable[[StepRecord], tuple[Any, ...]]:
    function = values_function("step_values", {f.name: f"r.{f.name}" for f in STEP_FIELDS})
    function.__doc__ = """``r`` as a ``steps`` row after its ``run_id``: plain values, in column
    order. A tuple of plain values is dropped from the garbage collector's tracking at its
    first collection, so records queued for the writer cost later collections nothing."""
    return function


def parse_ranks(ranks: str) -> list[int]:
    """``"1,3"`` -> ``[1, 3]``; ``""`` -> ``[]``."""
    return [int(rank) for rank in ranks.split(",")] if ranks else []


_SHOWN: dict[Kind, Convert] = {
    Kind.BOOL: bool,
    Kind.RANKS: parse_ranks,
    Kind.FLOAT_GROUPS: parse_lr_groups,
}

_FROM_ROW: tuple[tuple[int, Convert], ...] = tuple(
    (i, _SHOWN[f.kind]) for i, f in enumerate(STEP_FIELDS) if f.kind in _SHOWN
)


step_values = _record_values()


def step_dict(row: Sequence[Any], keys: Sequence[str] = EXPORT_COLUMNS) -> dict[str, Any]:
    """A raw step row in column order as a JSON-ready dict under ``keys`` (the export's,
    or the stream's)."""
    values = list(row)
    for i, convert in _FROM_ROW:
        values[i] = convert(values[i])
    return dict(zip(keys, values, strict=True))
