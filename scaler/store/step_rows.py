"""A step as the store keeps it and as it is shown, derived from :data:`STEP_FIELDS`.

:func:`step_values` turns a :class:`StepRecord` into its ``steps`` row (after ``run_id``);
:func:`step_dict` turns a row read back into JSON-ready values.

>>> step_dict(step_values(StepRecord(step=3, wall_time=1.5, scale=2.0, overflow=True,
...     skipped=True, inf_ranks=(1,), scale_after=1.0, growth_tracker=0, growth_interval=2,
...     growth_factor=2.0, backoff_factor=0.5, control_version=0)))["inf_ranks"]
[1]
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from math import isfinite
from operator import attrgetter
from typing import Any

from .records import format_inf_ranks, format_lr_groups, parse_lr_groups
from .step_schema import STEP_FIELDS, Kind, StepField, StepRecord

__all__ = ["COLUMNS", "EXPORT_COLUMNS", "parse_ranks", "step_dict", "step_values"]

# The columns of ``steps`` after ``run_id``, in table order.
COLUMNS: tuple[str, ...] = tuple(f.name for f in STEP_FIELDS)
EXPORT_COLUMNS: tuple[str, ...] = tuple(f.export_name for f in STEP_FIELDS)

Convert = Callable[[Any], Any]


def _ranks_text(ranks: tuple[int, ...]) -> str:
    return format_inf_ranks(ranks) if ranks else ""


def _groups_text(groups: tuple[tuple[float | None, ...], ...] | None) -> str | None:
    return None if groups is None else format_lr_groups(groups)


def _finite(value: float | None) -> float | None:
    return value if value is None or isfinite(value) else None


def _stored(f: StepField) -> Convert | None:
    if f.kind is Kind.RANKS:
        return _ranks_text
    if f.kind is Kind.FLOAT_GROUPS:
        return _groups_text
    return _finite if f.finite_only else None


def parse_ranks(ranks: str) -> list[int]:
    """``"1,3"`` -> ``[1, 3]``; ``""`` -> ``[]``."""
    return [int(rank) for rank in ranks.split(",")] if ranks else []


_SHOWN: dict[Kind, Convert] = {
    Kind.BOOL: bool,
    Kind.RANKS: parse_ranks,
    Kind.FLOAT_GROUPS: parse_lr_groups,
}

_GET = attrgetter(*COLUMNS)
_TO_ROW: tuple[tuple[int, Convert], ...] = tuple(
    (i, convert) for i, f in enumerate(STEP_FIELDS) if (convert := _stored(f)) is not None
)
_FROM_ROW: tuple[tuple[int, Convert], ...] = tuple(
    (i, _SHOWN[f.kind]) for i, f in enumerate(STEP_FIELDS) if f.kind in _SHOWN
)


def step_values(r: StepRecord) -> tuple[Any, ...]:
    """``r`` as a ``steps`` row after its ``run_id``: plain values, in column order.

    A tuple of plain values is dropped from the garbage collector's tracking at its first
    collection, so records queued for the writer cost later collections nothing.
    """
    row = list(_GET(r))
    for i, convert in _TO_ROW:
        row[i] = convert(row[i])
    return tuple(row)


def step_dict(row: Sequence[Any], keys: Sequence[str] = EXPORT_COLUMNS) -> dict[str, Any]:
    """A raw step row in column order as a JSON-ready dict under ``keys`` (the export's,
    or the stream's)."""
    values = list(row)
    for i, convert in _FROM_ROW:
        values[i] = convert(values[i])
    return dict(zip(keys, values, strict=True))
