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
from collections.abc import Sequence
from itertools import chain
from operator import itemgetter
from typing import Any

from . import postgres
from .schema import ROLLUP_LEVELS
from .sql import cursor_dialect, driver_sql
from .sqlite import insert_rows

__all__ = ["contiguous", "refresh_rollups", "rollup_plan"]

_COLUMNS = (
    "run_id, level, bucket, first_step, last_step, n, scale_min, scale_max, scale_last,"
    " tracker_min, tracker_max, tracker_last, overflows, skipped, loss_min, loss_max,"
    " lr_min, lr_max"
)
_COLUMN_NAMES = tuple(_COLUMNS.replace(" ", "").split(","))
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
    " a.agg_scale_min, a.agg_scale_max, s.scale_after,"
    " a.agg_tracker_min, a.agg_tracker_max, s.growth_tracker, a.agg_overflows, a.agg_skipped,"
    " a.agg_loss_min, a.agg_loss_max, a.agg_lr_min, a.agg_lr_max"
    " FROM (SELECT step / :width AS agg_bucket, min(step) AS agg_first,"
    " max(step) AS agg_last, count(*) AS agg_n,"
    " LEAST(min(scale), min(scale_after)) AS agg_scale_min,"
    " GREATEST(max(scale), max(scale_after)) AS agg_scale_max,"
    " min(growth_tracker) AS agg_tracker_min, max(growth_tracker) AS agg_tracker_max,"
    " sum(CAST(overflow AS INTEGER)) AS agg_overflows,"
    " sum(CAST(skipped AS INTEGER)) AS agg_skipped,"
    " min(loss) AS agg_loss_min, max(loss) AS agg_loss_max,"
    " min(lr) AS agg_lr_min, max(lr) AS agg_lr_max"
    " FROM steps WHERE run_id = :run AND step >= :lo AND step < :hi"
    " GROUP BY step / :width) AS a"
    " JOIN steps AS s ON s.run_id = :run AND s.step = a.agg_last{conflict}"
)
_FROM_CHILD = (
    f"{{insert}} INTO step_rollups ({_COLUMNS})"
    " SELECT :run, :level, a.agg_bucket, a.agg_first, a.agg_last, a.agg_n,"
    " a.agg_scale_min, a.agg_scale_max, c.scale_last,"
    " a.agg_tracker_min, a.agg_tracker_max, c.tracker_last, a.agg_overflows, a.agg_skipped,"
    " a.agg_loss_min, a.agg_loss_max, a.agg_lr_min, a.agg_lr_max"
    " FROM (SELECT bucket / :ratio AS agg_bucket, min(first_step) AS agg_first,"
    " max(last_step) AS agg_last, sum(n) AS agg_n,"
    " min(scale_min) AS agg_scale_min, max(scale_max) AS agg_scale_max,"
    " min(tracker_min) AS agg_tracker_min, max(tracker_max) AS agg_tracker_max,"
    " sum(overflows) AS agg_overflows, sum(skipped) AS agg_skipped,"
    " min(loss_min) AS agg_loss_min, max(loss_max) AS agg_loss_max,"
    " min(lr_min) AS agg_lr_min, max(lr_max) AS agg_lr_max"
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


# A rollup on the host: the columns of step_rollups after run_id and level.
_BUCKET, _FIRST, _LAST, _N, _SMIN, _SMAX, _SLAST, _TMIN, _TMAX, _TLAST, _OVER, _SKIP = range(12)
_LMIN, _LMAX, _RMIN, _RMAX = range(12, 16)
# The loss and learning rate columns of a ``steps`` row (run_id first).
_LOSS, _LR = 13, 16


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


def _from_steps(columns: tuple[tuple[Any, ...], ...], width: int) -> list[list[Any]]:
    """The rollups of ``width``-step buckets of the ``steps`` columns, in step order."""
    _, numbers, _, scale, overflow, skipped, _, after, tracker, *_ = columns
    loss, lr = columns[_LOSS], columns[_LR]
    # Steps without a loss (NULL) are left out of its min and max, as SQL's min() does.
    losses = _loss_range if None in loss else _plain_range
    rates = _loss_range if None in lr else _plain_range
    rollups: list[list[Any]] = []
    start = 0
    while start < len(numbers):
        bucket = numbers[start] // width
        end = bisect_left(numbers, (bucket + 1) * width, start)
        last = end - 1
        rollups.append(
            [
                bucket,
                numbers[start],
                numbers[last],
                end - start,
                min(min(scale[start:end]), min(after[start:end])),
                max(max(scale[start:end]), max(after[start:end])),
                after[last],
                min(tracker[start:end]),
                max(tracker[start:end]),
                tracker[last],
                sum(overflow[start:end]),
                sum(skipped[start:end]),
                *losses(loss[start:end]),
                *rates(lr[start:end]),
            ]
        )
        start = end
    return rollups


def _plain_range(values: Sequence[float]) -> tuple[float, float]:
    return min(values), max(values)


def _loss_range(values: Sequence[float | None]) -> tuple[float | None, float | None]:
    present = [value for value in values if value is not None]
    return (min(present), max(present)) if present else (None, None)


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


def _merge(earlier: Sequence[Any], later: Sequence[Any]) -> list[Any]:
    """One rollup of two in ``earlier``'s bucket, ``earlier``'s steps all before ``later``'s."""
    return [
        earlier[_BUCKET],
        earlier[_FIRST],
        later[_LAST],
        earlier[_N] + later[_N],
        min(earlier[_SMIN], later[_SMIN]),
        max(earlier[_SMAX], later[_SMAX]),
        later[_SLAST],
        min(earlier[_TMIN], later[_TMIN]),
        max(earlier[_TMAX], later[_TMAX]),
        later[_TLAST],
        earlier[_OVER] + later[_OVER],
        earlier[_SKIP] + later[_SKIP],
        _least(earlier[_LMIN], later[_LMIN]),
        _greatest(earlier[_LMAX], later[_LMAX]),
        _least(earlier[_RMIN], later[_RMIN]),
        _greatest(earlier[_RMAX], later[_RMAX]),
    ]


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
