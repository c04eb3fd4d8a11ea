"""Upkeep of ``step_rollups``, the pre-aggregated buckets charts read, as steps are written.

Each level of ``ROLLUP_LEVELS`` groups steps into buckets of its width. Steps newer than
every stored one (the telemetry writer's batch) are folded on the host
(:mod:`.rollup_rows`): one read of the rows they extend and one write of every row they
touch. Other writes (a retried batch,
steps replayed after resuming from an older checkpoint) recompute their buckets in SQL
from what ``steps`` holds.

The levels of ``SEALED_LEVELS`` keep only buckets that are over (their last step at or
before the run's last step): each is merged from its parent level's rows once, when a
write takes the run past it, in the same read and write as the other levels'.

Few statements matter as much as little work: the driver releases and retakes the GIL
around each one, and each time the training thread may have to wait for it.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import chain
from operator import itemgetter
from typing import Any

from . import postgres
from .rollup_rows import BUCKET, from_child, from_steps, merge
from .schema import ROLLUP_LEVELS, SEALED_LEVELS
from .sql import cursor_dialect, driver_sql
from .sqlite import insert_rows
from .step_schema import SERIES, Fold

__all__ = ["contiguous", "refresh_rollups", "rollup_plan", "sealed_plan"]


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

SealedPlan = tuple[tuple[int, int, int, int], ...]


def sealed_plan(
    levels: dict[int, int] = SEALED_LEVELS, parents: dict[int, int] = ROLLUP_LEVELS
) -> SealedPlan:
    """``(level, width, parent level, parent width)``: each level of ``levels`` and the
    widest of ``parents`` narrower than it that divides it, which its rows are merged from.

    >>> sealed_plan({7: 16, 9: 128}, {6: 8, 1: 64})
    ((7, 16, 6, 8), (9, 128, 1, 64))
    """
    plan = []
    for level, width in sorted(levels.items(), key=lambda item: item[1]):
        divides = [(p, w) for p, w in parents.items() if w < width and width % w == 0]
        parent, parent_width = max(divides, key=lambda item: item[1])
        plan.append((level, width, parent, parent_width))
    return tuple(plan)


@dataclass(frozen=True, slots=True)
class Sealing:
    """The levels kept for buckets that are over, of those whose parent is written, and
    the run's last step before a write and after it."""

    plan: SealedPlan
    before: int
    after: int

    def newly_over(self, width: int) -> tuple[int, int]:
        """The buckets of ``width`` steps the write takes the run past: ``[first, last]``."""
        return (self.before + 1) // width, (self.after + 1) // width - 1


SEALED = sealed_plan()


def refresh_rollups(
    cursor: Any, run_id: int, rows: Sequence[tuple[Any, ...]], *, fresh: bool, last_before: int
) -> None:
    """Bring the rollups of the buckets ``rows`` (just written ``steps`` rows) fall in up to date.

    ``fresh``: every row is a step after every step stored before them; ``last_before``:
    the run's last step before them.
    """
    step_numbers = [row[1] for row in rows]
    written = {(level, width) for level, width, *_ in PLAN}
    sealing = Sealing(
        tuple(entry for entry in SEALED if (entry[2], entry[3]) in written),
        last_before,
        max(last_before, *step_numbers),
    )
    if fresh:
        _fold(cursor, run_id, rows, PLAN, sealing)
    else:
        _recompute(cursor, run_id, step_numbers, PLAN)
        _reseal(cursor, run_id, step_numbers, sealing)


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


def _reseal(cursor: Any, run_id: int, step_numbers: Sequence[int], sealing: Sealing) -> None:
    """Recompute, from their parents' rows, the sealed buckets over that ``step_numbers``
    fall in, and write those the write takes the run past."""
    dialect = cursor_dialect(cursor)
    for level, width, parent, parent_width in sealing.plan:
        over = {
            b
            for b in (step // width for step in step_numbers)
            if (b + 1) * width - 1 <= sealing.after
        }
        spans = contiguous(over)
        first, last = sealing.newly_over(width)
        if first <= last:
            spans.append((first, last))  # may overlap: a bucket written twice is the same row
        ratio = width // parent_width
        for low, high in spans:
            cursor.execute(
                _statement(_FROM_CHILD, dialect),
                {
                    "run": run_id,
                    "level": level,
                    "child": parent,
                    "ratio": ratio,
                    "child_width": parent_width,
                    "lo": low * ratio,
                    "hi": (high + 1) * ratio,
                },
            )


def _fold(
    cursor: Any, run_id: int, rows: Sequence[tuple[Any, ...]], plan: Plan, sealing: Sealing
) -> None:
    """Fold new steps into every level: one read of the rows they extend, one write."""
    # The batch's columns in step order (a transpose costs less than a pass per column).
    columns = tuple(zip(*sorted(rows, key=itemgetter(1)), strict=True))
    levels: dict[int, list[list[Any]]] = {}
    for level, width, child, child_width in plan:
        if child is None:
            levels[level] = from_steps(columns, width)
        else:
            levels[level] = from_child(levels[child], width // child_width)
    # Only the first bucket of a level can hold stored steps; its stored row covers them.
    firsts = [(run_id, level, rollups[0][BUCKET]) for level, rollups in levels.items()]
    # A sealed bucket the batch takes the run past, whose first steps came before it: its
    # parent's rows up to the last step before the batch (one range a parent).
    seals: list[tuple[int, int, int, int, int]] = []
    starts: dict[int, tuple[int, int]] = {}
    for level, width, parent, parent_width in sealing.plan:
        first, last = sealing.newly_over(width)
        if first <= last:
            ratio = width // parent_width
            seals.append((level, ratio, parent, first, last))
            if first * width <= sealing.before:
                start = (first * ratio, sealing.before // parent_width)
                starts[parent] = min(starts.get(parent, start), start)
    spans = [(run_id, parent, *start) for parent, start in starts.items()]
    dialect = cursor_dialect(cursor)
    cursor.execute(
        driver_sql(_stored_sql(len(firsts), len(spans)), dialect),
        tuple(chain(chain.from_iterable(firsts), chain.from_iterable(spans))),
    )
    stored = {(level, rest[BUCKET]): rest for level, *rest in cursor.fetchall()}
    for level, rollups in levels.items():
        extended = stored.get((level, rollups[0][BUCKET]))
        if extended is not None:
            rollups[0] = merge(extended, rollups[0])
    rows = [(run_id, level, *rollup) for level, rollups in levels.items() for rollup in rollups]
    for level, ratio, parent, first, last in seals:
        children = {b: row for (lv, b), row in stored.items() if lv == parent}
        children.update((row[BUCKET], row) for row in levels[parent])
        inside = sorted(
            (row for b, row in children.items() if first * ratio <= b < (last + 1) * ratio),
            key=itemgetter(BUCKET),
        )
        rows += [(run_id, level, *rollup) for rollup in from_child(inside, ratio)]
    if dialect == "sqlite":
        insert_rows(cursor, _INSERT, rows)
    else:
        postgres.upsert_rows(cursor, "step_rollups", _COLUMN_NAMES, _KEY, rows)


@functools.cache
def _stored_sql(levels: int, spans: int = 0) -> str:
    """The stored rollups of ``levels`` (level, bucket) pairs of one run, then of ``spans``
    (level, first bucket, last bucket): a primary-key lookup or range each (``OR``-ed pairs
    would read every rollup of the run)."""
    one = f"SELECT {_STORED} FROM step_rollups WHERE run_id = ? AND level = ? AND bucket = ?"
    span = (
        f"SELECT {_STORED} FROM step_rollups"
        " WHERE run_id = ? AND level = ? AND bucket BETWEEN ? AND ?"
    )
    return " UNION ALL ".join([one] * levels + [span] * spans)


def contiguous(values: set[int]) -> list[tuple[int, int]]:
    """``{1, 2, 3, 7}`` -> ``[(1, 3), (7, 7)]``."""
    ranges: list[tuple[int, int]] = []
    for value in sorted(values):
        if ranges and value == ranges[-1][1] + 1:
            ranges[-1] = (ranges[-1][0], value)
        else:
            ranges.append((value, value))
    return ranges
