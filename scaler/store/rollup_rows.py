"""Rollup rows computed on the host: a batch of new steps' buckets at one level, a coarser
level's from a finer one's rows, and two rows of one bucket merged.

A row is the columns of ``step_rollups`` after ``run_id`` and ``level``: the bucket, its
first and last step, its number of steps, then each series' (:data:`BUCKET` indexes it).
"""

from __future__ import annotations

import functools
from bisect import bisect_left
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from .step_rows import COLUMNS
from .step_schema import SERIES, Fold

__all__ = ["BUCKET", "from_child", "from_steps", "merge"]

_BUCKET, _FIRST, _LAST, _N = range(4)
BUCKET = _BUCKET
_STEP = 1 + COLUMNS.index("step")  # in a ``steps`` row, run_id first


@dataclass(frozen=True, slots=True)
class _Part:
    """How one series is folded on the host: from the columns of a batch of steps (their
    indexes in a ``steps`` row), and two rollups into one (at ``at``)."""

    fold: Fold
    at: int
    columns: tuple[int, ...]
    nullable: bool
    last: int | None  # the column whose last value step_rollups keeps


def _parts() -> tuple[_Part, ...]:
    parts, at = [], _N + 1
    for spec in SERIES:
        if spec.fold is Fold.LAST:
            continue
        last = spec.last
        parts.append(
            _Part(
                fold=spec.fold,
                at=at,
                columns=tuple(1 + COLUMNS.index(f.name) for f in spec.fields),
                nullable=spec.nullable,
                last=1 + COLUMNS.index(last.name) if spec.kept_last and last else None,
            )
        )
        at += len(spec.stored)
    return tuple(parts)


_PARTS = _parts()


Folder = Callable[[int, int, int], tuple[Any, ...]]


def _folders(columns: tuple[tuple[Any, ...], ...]) -> list[Folder]:
    """For each series kept, its values of the steps ``[start, end)`` of a batch's
    ``columns`` (``last`` the bucket's last): one call a series and bucket."""
    folders: list[Folder] = []
    for part in _PARTS:
        values = [columns[c] for c in part.columns]
        kept = columns[part.last] if part.last is not None else None
        if part.fold is Fold.COUNT:
            folders.append(functools.partial(_count, values[0]))
        elif any(None in v for v in values):
            # Steps without a value (NULL) are left out of the range, as SQL's min() does.
            folders.append(functools.partial(_present_range, values, kept))
        elif len(values) == 1:
            folders.append(functools.partial(_range, values[0], kept))
        else:
            folders.append(functools.partial(_ranges, values, kept))
    return folders


def _count(flags: Sequence[int], start: int, end: int, last: int) -> tuple[Any, ...]:
    return (sum(flags[start:end]),)


def _range(
    values: Sequence[Any], kept: Sequence[Any] | None, start: int, end: int, last: int
) -> tuple[Any, ...]:
    bucket = values[start:end]
    if kept is None:
        return min(bucket), max(bucket)
    return min(bucket), max(bucket), kept[last]


def _ranges(
    columns: Sequence[Sequence[Any]], kept: Sequence[Any] | None, start: int, end: int, last: int
) -> tuple[Any, ...]:
    buckets = [values[start:end] for values in columns]
    low, high = min(map(min, buckets)), max(map(max, buckets))
    return (low, high) if kept is None else (low, high, kept[last])


def _present_range(
    columns: Sequence[Sequence[Any]], kept: Sequence[Any] | None, start: int, end: int, last: int
) -> tuple[Any, ...]:
    present = [v for values in columns for v in values[start:end] if v is not None]
    low, high = (min(present), max(present)) if present else (None, None)
    return (low, high) if kept is None else (low, high, kept[last])


def from_steps(columns: tuple[tuple[Any, ...], ...], width: int) -> list[list[Any]]:
    """The rollups of ``width``-step buckets of the ``steps`` columns, in step order."""
    numbers = columns[_STEP]
    folders = _folders(columns)
    rollups: list[list[Any]] = []
    start = 0
    while start < len(numbers):
        bucket = numbers[start] // width
        end = bisect_left(numbers, (bucket + 1) * width, start)
        last = end - 1
        rollup = [bucket, numbers[start], numbers[last], end - start]
        for folder in folders:
            rollup += folder(start, end, last)
        rollups.append(rollup)
        start = end
    return rollups


def _least(a: float | None, b: float | None) -> float | None:
    return b if a is None else a if b is None else min(a, b)


def _greatest(a: float | None, b: float | None) -> float | None:
    return b if a is None else a if b is None else max(a, b)


def from_child(children: list[list[Any]], ratio: int) -> list[list[Any]]:
    """Rollups of buckets ``ratio`` times as wide as ``children``'s, in order."""
    rollups: list[list[Any]] = []
    for child in children:
        bucket = child[_BUCKET] // ratio
        if rollups and rollups[-1][_BUCKET] == bucket:
            rollups[-1] = merge(rollups[-1], child)
        else:
            rollups.append([bucket, *child[1:]])
    return rollups


def _merge_function() -> Callable[[Sequence[Any], Sequence[Any]], list[Any]]:
    """``_merge``, written out from the series as one list (as ``step_values`` is): the
    writer merges a few rollups a step, and a loop over the series took three times as long."""
    values = ["earlier[_BUCKET]", "earlier[_FIRST]", "later[_LAST]", "earlier[_N] + later[_N]"]
    for part in _PARTS:
        at = part.at
        if part.fold is Fold.COUNT:
            values.append(f"earlier[{at}] + later[{at}]")
            continue
        low, high = ("_least", "_greatest") if part.nullable else ("min", "max")
        values += [
            f"{low}(earlier[{at}], later[{at}])",
            f"{high}(earlier[{at + 1}], later[{at + 1}])",
        ]
        if part.last is not None:
            values.append(f"later[{at + 2}]")
    source = f"def _merge(earlier, later):\n    return [{', '.join(values)}]\n"
    namespace: dict[str, Any] = {"_least": _least, "_greatest": _greatest}
    namespace.update(_BUCKET=_BUCKET, _FIRST=_FIRST, _LAST=_LAST, _N=_N)
    exec(source, namespace)  # the source is the declaration's, never input
    merge: Callable[[Sequence[Any], Sequence[Any]], list[Any]] = namespace["_merge"]
    merge.__doc__ = "One rollup of two in ``earlier``'s bucket, ``earlier``'s steps all first."
    return merge


merge = _merge_function()
