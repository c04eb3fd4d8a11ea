"""Upkeep of ``step_rollups``, the pre-aggregated buckets charts read, as steps are written.

Each level of ``ROLLUP_LEVELS`` groups steps into buckets of its width. Steps newer than
every stored one (the telemetry writer's batch) are folded on the host: one read of the
rows they extend and one write of every row they touch. Other writes (a retried batch,
steps replayed after resuming from an older checkpoint) recompute their buckets in SQL
from what ``steps`` holds.

Few statements matter as much as little work: the driver releases and retakes the GIL
around each one, and each time the training thread may have to wait for it.
"""

from __future__ import annotations

import functools
from bisect import bisect_left
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from itertools import chain
from operator import itemgetter
from typing import Any

from . import postgres
from .schema import ROLLUP_LEVELS
from .sql import cursor_dialect, driver_sql
from .sqlite import insert_rows
from .step_rows import COLUMNS
from .step_schema import SERIES, Fold

__all__ = ["contiguous", "refresh_rollups", "rollup_plan"]


def _sql_columns() -> tuple[list[str], list[str], list[str], list[str], list[str]]:
    """The series' columns of step_rollups, and how they are computed: from ``steps``
    (aggregates of ``a``, the last step's of ``s``) and from a finer level's rows (of
    ``a``, and of ``c``, the child row of the last step)."""
    stored: list[str] = []
    from_steps: list[str] = []
    from_child: list[str] = []
    aggregates: list[str] = []
    child_aggregates: list[str] = []
    for spec in SERIES:
        names = [f.name for f in spec.fields]
        stored.extend(spec.stored)
        if spec.fold is Fold.RANGE:
            low, high = spec.kept
            from_steps += [f"a.agg_{low}", f"a.agg_{high}"]
            from_child += [f"a.agg_{low}", f"a.agg_{high}"]
            child_aggregates += [f"min({low}) AS agg_{low}", f"max({high}) AS agg_{high}"]
            if len(names) == 1:
                aggregates += [f"min({names[0]}) AS agg_{low}", f"max({names[0]}) AS agg_{high}"]
            else:
                lows = ", ".join(f"min({name})" for name in names)
                highs = ", ".join(f"max({name})" for name in names)
                aggregates += [f"LEAST({lows}) AS agg_{low}", f"GREATEST({highs}) AS agg_{high}"]
        elif spec.fold is Fold.COUNT:
            from_steps.append(f"a.agg_{spec.name}")
            from_child.append(f"a.agg_{spec.name}")
            aggregates.append(f"sum(CAST({names[0]} AS INTEGER)) AS agg_{spec.name}")
            child_aggregates.append(f"sum({spec.name}) AS agg_{spec.name}")
        last = spec.last
        if spec.kept_last and last is not None:
            from_steps.append(f"s.{last.name}")
            from_child.append(f"c.{spec.name}_last")
    return stored, from_steps, from_child, aggregates, child_aggregates


_SERIES_COLUMNS, _STEPS_VALUES, _CHILD_VALUES, _STEPS_AGGREGATES, _CHILD_AGGREGATES = _sql_columns()
_COLUMN_NAMES = ("run_id", "level", "bucket", "first_step", "last_step", "n", *_SERIES_COLUMNS)
_COLUMNS = ", ".join(_COLUMN_NAMES)
_KEY = ("run_id", "level", "bucket")
# SQLite's INSERT OR REPLACE, as PostgreSQL writes it (after the rows).
_REPLACE = {
    "sqlite": ("INSERT OR REPLACE", ""),
    "postgresql": (
        "INSERT",
        f" ON CONFLICT ({', '.join(_KEY)}) DO UPDATE SET "
        + ", ".join(f"{c} = EXCLUDED.{c}" for c in _COLUMN_NAMES if c not in _KEY),
    ),
}
# Aliases are prefixed: SQLite resolves a bare name in WHERE/GROUP BY to a result alias.
# Run on the driver's cursor through driver_sql.
_FROM_STEPS = (
    f"{{insert}} INTO step_rollups ({_COLUMNS})"
    " SELECT :run, :level, a.agg_bucket, a.agg_first, a.agg_last, a.agg_n,"
    f" {', '.join(_STEPS_VALUES)}"
    " FROM (SELECT step / :width AS agg_bucket, min(step) AS agg_first,"
    " max(step) AS agg_last, count(*) AS agg_n,"
    f" {', '.join(_STEPS_AGGREGATES)}"
    " FROM steps WHERE run_id = :run AND step >= :lo AND step < :hi"
    " GROUP BY step / :width) AS a"
    " JOIN steps AS s ON s.run_id = :run AND s.step = a.agg_last{conflict}"
)
_FROM_CHILD = (
    f"{{insert}} INTO step_rollups ({_COLUMNS})"
    " SELECT :run, :level, a.agg_bucket, a.agg_first, a.agg_last, a.agg_n,"
    f" {', '.join(_CHILD_VALUES)}"
    " FROM (SELECT bucket / :ratio AS agg_bucket, min(first_step) AS agg_first,"
    " max(last_step) AS agg_last, sum(n) AS agg_n,"
    f" {', '.join(_CHILD_AGGREGATES)}"
    " FROM step_rollups WHERE run_id = :run AND level = :child AND bucket >= :lo AND bucket < :hi"
    " GROUP BY bucket / :ratio) AS a"
    " JOIN step_rollups AS c ON c.run_id = :run AND c.level = :child"
    " AND c.bucket = a.agg_last / :child_width{conflict}"
)

_INSERT = f"INSERT OR REPLACE INTO step_rollups ({_COLUMNS})"
_STORED = _COLUMNS.removeprefix("run_id, ")

Plan = tuple[tuple[int, int, int | None, int], ...]


def rollup_plan(levels: dict[int, int] = ROLLUP_LEVELS) -> Plan:
    """``(level, width, child level or None, child width)``, finest first.

    A level whose width is a multiple of the next finer one is merged from that level's
    rows (at most width/child_width of them per bucket) instead of from ``steps``.
    """
    plan: list[tuple[int, int, int | None, int]] = []
    for level, width in sorted(levels.items(), key=lambda item: item[1]):
        child = plan[-1] if plan else None
        if child is not None and width % child[1] == 0:
            plan.append((level, width, child[0], child[1]))
        else:
            plan.append((level, width, None, 1))
    return tuple(plan)


# The levels written (a test of an older revision sets its own).
PLAN = rollup_plan()


def refresh_rollups(
    cursor: Any, run_id: int, rows: Sequence[tuple[Any, ...]], *, fresh: bool
) -> None:
    """Bring the rollups of the buckets ``rows`` (just written ``steps`` rows) fall in up to date.

    ``fresh``: every row is a step after every step stored before them.
    """
    if fresh:
        _fold(cursor, run_id, rows, PLAN)
    else:
        _recompute(cursor, run_id, [row[1] for row in rows], PLAN)


@functools.cache
def _statement(template: str, dialect: str) -> str:
    insert, conflict = _REPLACE[dialect]
    return driver_sql(template.format(insert=insert, conflict=conflict), dialect)


def _recompute(cursor: Any, run_id: int, step_numbers: Sequence[int], plan: Plan) -> None:
    dialect = cursor_dialect(cursor)
    touched: set[int] = set()
    for level, width, child, child_width in plan:
        if child is None:
            touched = {step // width for step in step_numbers}
            statement, unit = _FROM_STEPS, width
        else:
            touched = {bucket * child_width // width for bucket in touched}
            statement, unit = _FROM_CHILD, width // child_width
        for first, last in contiguous(touched):
            cursor.execute(
                _statement(statement, dialect),
                {
                    "run": run_id,
                    "level": level,
                    "child": child,
                    "width": width,
                    "ratio": unit,
                    "child_width": child_width,
                    "lo": first * unit,
                    "hi": (last + 1) * unit,
                },
            )


# A rollup on the host: the columns of step_rollups after run_id and level, that is the
# bucket, its first and last step, its number of steps, then each series' (_SERIES_COLUMNS).
_BUCKET, _FIRST, _LAST, _N = range(4)
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


def _fold(cursor: Any, run_id: int, rows: Sequence[tuple[Any, ...]], plan: Plan) -> None:
    """Fold new steps into every level: one read of the rows they extend, one write."""
    # The batch's columns in step order (a transpose costs less than a pass per column).
    columns = tuple(zip(*sorted(rows, key=itemgetter(1)), strict=True))
    levels: dict[int, list[list[Any]]] = {}
    for level, width, child, child_width in plan:
        if child is None:
            levels[level] = _from_steps(columns, width)
        else:
            levels[level] = _from_child(levels[child], width // child_width)
    # Only the first bucket of a level can hold stored steps; its stored row covers them.
    firsts = [(run_id, level, rollups[0][_BUCKET]) for level, rollups in levels.items()]
    dialect = cursor_dialect(cursor)
    cursor.execute(
        driver_sql(_stored_sql(len(firsts)), dialect), tuple(chain.from_iterable(firsts))
    )
    for level, *stored in cursor.fetchall():
        rollups = levels[level]
        rollups[0] = _merge(stored, rollups[0])
    rows = [(run_id, level, *rollup) for level, rollups in levels.items() for rollup in rollups]
    if dialect == "sqlite":
        insert_rows(cursor, _INSERT, rows)
    else:
        postgres.upsert_rows(cursor, "step_rollups", _COLUMN_NAMES, _KEY, rows)


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


def _from_steps(columns: tuple[tuple[Any, ...], ...], width: int) -> list[list[Any]]:
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


def _from_child(children: list[list[Any]], ratio: int) -> list[list[Any]]:
    """Rollups of buckets ``ratio`` times as wide as ``children``'s, in order."""
    rollups: list[list[Any]] = []
    for child in children:
        bucket = child[_BUCKET] // ratio
        if rollups and rollups[-1][_BUCKET] == bucket:
            rollups[-1] = _merge(rollups[-1], child)
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


_merge = _merge_function()


@functools.cache
def _stored_sql(levels: int) -> str:
    """The stored rollups of ``levels`` (level, bucket) pairs of one run: a primary-key
    lookup each (``OR``-ed pairs would read every rollup of the run)."""
    one = f"SELECT {_STORED} FROM step_rollups WHERE run_id = ? AND level = ? AND bucket = ?"
    return " UNION ALL ".join([one] * levels)


def contiguous(values: set[int]) -> list[tuple[int, int]]:
    """``{1, 2, 3, 7}`` -> ``[(1, 3), (7, 7)]``."""
    ranges: list[tuple[int, int]] = []
    for value in sorted(values):
        if ranges and value == ranges[-1][1] + 1:
            ranges[-1] = (ranges[-1][0], value)
        else:
            ranges.append((value, value))
    return ranges
