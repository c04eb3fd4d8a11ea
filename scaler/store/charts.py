"""Chart series: at most ``max_points`` spike-preserving buckets of a run's steps.

Every bucket carries the min, max and last of the scale, the growth tracker, the loss (its
finite values; null when the bucket has none) and the learning rate (null when not
recorded), and the count of overflows, read from ``step_rollups`` when a bucket spans many
steps and from ``steps`` when it spans few.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import Connection, text

from .chart_cache import ChartCache
from .engine import Store
from .schema import ROLLUP_LEVELS
from .sql import driver_sql
from .step_schema import SERIES, SERIES_KEYS, Fold

__all__ = ["Series", "chart_series", "step_bounds"]

# (level, width), coarsest first.
_LEVELS: tuple[tuple[int, int], ...] = tuple(
    sorted(ROLLUP_LEVELS.items(), key=lambda item: item[1], reverse=True)
)


@dataclass
class Series:
    """Columnar chart buckets over ``[start, end]``, each ``bucket_width`` steps wide."""

    run: int
    start: int | None
    end: int | None
    bucket_width: int
    columns: dict[str, list[Any]] = field(default_factory=lambda: {key: [] for key in SERIES_KEYS})


def _pieces(lo: int, hi: int, levels: Sequence[tuple[int, int]]) -> list[tuple[int, int, int]]:
    """Cover steps ``[lo, hi]`` with whole rollup buckets, coarsest first, and raw steps.

    Returns ``(level, first, last)``: bucket indexes for a rollup level, steps for level 0.
    >>> _pieces(10, 200, [(1, 64)])
    [(0, 10, 63), (1, 1, 2), (0, 192, 200)]
    """
    if lo > hi:
        return []
    if not levels:
        return [(0, lo, hi)]
    (level, width), finer = levels[0], levels[1:]
    first, last = -(-lo // width), (hi + 1) // width - 1
    if first > last:
        return _pieces(lo, hi, finer)
    return [
        *_pieces(lo, first * width - 1, finer),
        (level, first, last),
        *_pieces((last + 1) * width, hi, finer),
    ]


def _bucket_width(span: int, max_points: int) -> tuple[int, list[tuple[int, int]]]:
    """The bucket width for ``span`` steps and the rollup levels that fit inside it.

    Aligned buckets of width ``w >= (span - 1) / (max_points - 1)`` number at most
    ``max_points``; the width is rounded up to a multiple of the coarsest rollup width
    not above ``2 w``, so buckets are whole rollup buckets and at least about half of
    ``max_points`` remain. Below the finest rollup width that allowance is ``4 w`` (at
    least about a quarter remain): only a window of ``max_points`` steps or fewer is
    read from ``steps``, one bucket a step.
    """
    width = max(1, -(-(span - 1) // (max_points - 1)))
    usable = [(level, w) for level, w in _LEVELS if w <= 2 * width]
    if not usable and _LEVELS and _LEVELS[-1][1] <= 4 * width:
        usable = [_LEVELS[-1]]
    if usable:
        coarsest = usable[0][1]
        width = -(-width // coarsest) * coarsest
    return width, usable


def _piece_columns() -> tuple[list[str], list[str], list[str], list[str]]:
    """The chart query's columns, series by series: of a step as a bucket of its own, of a
    rollup row, of the buckets grouped, and of the answer."""
    raw = ["step AS first_step", "step AS last_step", "1 AS n"]
    kept = ["first_step", "last_step", "n"]
    grouped = ["min(first_step) AS first_step", "max(last_step) AS last_step", "sum(n) AS n"]
    answer = ["g.first_step", "g.last_step", "g.n"]
    for spec in SERIES:
        names = [f.name for f in spec.fields]
        kept.extend(spec.kept)
        answer.extend(f"g.{column}" for column in spec.kept)
        if spec.fold is Fold.RANGE:
            low, high = spec.kept
            if len(names) == 1:
                raw += [f"{names[0]} AS {low}", f"{names[0]} AS {high}"]
            else:
                raw += [f"LEAST({', '.join(names)}) AS {low}"]
                raw += [f"GREATEST({', '.join(names)}) AS {high}"]
            grouped += [f"min({low}) AS {low}", f"max({high}) AS {high}"]
        elif spec.fold is Fold.COUNT:
            raw.append(f"CAST({names[0]} AS INTEGER) AS {spec.name}")
            grouped.append(f"sum({spec.name}) AS {spec.name}")
        last = spec.last
        if last is not None:
            answer.append(f"s.{last.name}")
    return raw, kept, grouped, answer


_RAW, _KEPT, _GROUPS, _ANSWER = _piece_columns()
_RAW_PIECE = (
    f"SELECT {', '.join(_RAW)}"
    " FROM steps WHERE run_id = :run AND step BETWEEN :lo{i} AND :hi{i}"
)
_ROLLUP_PIECE = (
    f"SELECT {', '.join(_KEPT)} FROM step_rollups"
    " WHERE run_id = :run AND level = :level{i} AND bucket BETWEEN :lo{i} AND :hi{i}"
)
_GROUPED = (
    "WITH p AS ({pieces})"
    f" SELECT {', '.join(_ANSWER)} FROM ("
    f"  SELECT first_step / :width AS ob, {', '.join(_GROUPS)}"
    "  FROM p GROUP BY ob"
    " ) AS g JOIN steps AS s ON s.run_id = :run AND s.step = g.last_step ORDER BY g.ob"
)


# Two sub-selects: SQLite answers a lone min() or max() from the index, not both at once;
# one statement: one round trip to a server.
_FIRST_AND_LAST = (
    "(SELECT step FROM steps WHERE run_id = :run ORDER BY step ASC LIMIT 1),"
    " (SELECT step FROM steps WHERE run_id = :run ORDER BY step DESC LIMIT 1)"
)
_BOUNDS = f"SELECT {_FIRST_AND_LAST}"
# The bounds, and the count of writes that replaced stored steps (a ChartCache's check).
_BOUNDS_AND_REWRITES = f"SELECT {_FIRST_AND_LAST}, (SELECT step_rewrites FROM runs WHERE id = :run)"


def step_bounds(conn: Connection, run_id: int) -> tuple[int, int] | None:
    """The first and last step stored of a run, or None when it has none."""
    first, last = conn.execute(text(_BOUNDS), {"run": run_id}).one()
    return None if first is None or last is None else (int(first), int(last))


def chart_series(
    store: Store,
    run_id: int,
    *,
    start: int | None = None,
    end: int | None = None,
    max_points: int = 1000,
    cache: ChartCache | None = None,
) -> Series:
    """At most ``max_points`` buckets over steps ``[start, end]`` (default: the whole run).

    A bucket with an overflow has ``overflows > 0`` and a ``scale_min`` at or below the
    scale the overflow dropped to; narrow ranges come back one step per bucket. With a
    ``cache``, buckets of rollup rows that can no longer change are read once.
    """
    if max_points < 2:
        raise ValueError("max_points must be at least 2")
    with store.engine.connect() as conn:
        first, last, rewrites = conn.execute(text(_BOUNDS_AND_REWRITES), {"run": run_id}).one()
        if first is None or last is None:
            return Series(run_id, start, end, 1)
        lo = first if start is None else max(start, first)
        hi = last if end is None else min(end, last)
        # An end not asked for is the run's last step, or none past it (no reversed range).
        shown_end = (hi if hi >= lo else None) if end is None else end
        series = Series(run_id, lo if start is None else start, shown_end, 1)
        if lo > hi:
            return series
        width, levels = _bucket_width(hi - lo + 1, max_points)
        series.bucket_width = width

        def read(spans: list[tuple[int, int]]) -> Sequence[Any]:
            return _read_buckets(conn, run_id, width, levels, spans)

        if cache is None or not levels:  # one step a bucket: nothing worth keeping
            rows: Sequence[Any] = read([(lo, hi)])
        else:
            rows = cache.series_rows(
                run_id,
                width,
                rewrites=rewrites or 0,
                span=(lo, hi),
                stored=(first, last),
                read=read,
            )
    for key, values in zip(SERIES_KEYS, zip(*rows, strict=True), strict=False):
        series.columns[key] = list(values)
    return series


def _read_buckets(
    conn: Connection,
    run_id: int,
    width: int,
    levels: Sequence[tuple[int, int]],
    spans: Sequence[tuple[int, int]],
) -> Sequence[Any]:
    """The buckets of steps ``spans`` (apart, each whole buckets but at the ends of the
    chart), in step order: one query, whatever the spans."""
    params: dict[str, int] = {"run": run_id, "width": width}
    selects = []
    pieces = (piece for lo, hi in spans for piece in _pieces(lo, hi, levels))
    for i, (level, first, last) in enumerate(pieces):
        params[f"lo{i}"], params[f"hi{i}"] = first, last
        if level:
            params[f"level{i}"] = level
            selects.append(_ROLLUP_PIECE.format(i=i))
        else:
            selects.append(_RAW_PIECE.format(i=i))
    if not selects:
        return []
    sql = _GROUPED.format(pieces=" UNION ALL ".join(selects))
    cursor = conn.connection.cursor()  # the driver's tuples: no Row a bucket
    try:
        cursor.execute(driver_sql(sql, conn.dialect.name), params)
        rows: Sequence[Any] = cursor.fetchall()
    finally:
        cursor.close()
    return rows
