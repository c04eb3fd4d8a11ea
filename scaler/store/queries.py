"""Read queries for the service: runs, chart series, exports, live tails (overflow pages and
their parameters: :mod:`scalewatch.store.diagnosis`).

Chart series are spike-preserving: every bucket carries the min, max and last of the
scale, the growth tracker, the loss (its finite values; null when the bucket has none)
and the learning rate (null when not recorded), and the count of overflows, read from
``step_rollups`` when a bucket spans many steps and from ``steps`` when it spans few.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import Boolean, Connection, RowMapping, text

from .engine import Store
from .runs import effective_status
from .schema import ROLLUP_LEVELS, runs, steps
from .sql import driver_sql
from .states import RunStatus
from .step_rows import COLUMNS, EXPORT_COLUMNS, parse_ranks, step_dict
from .step_schema import SERIES, SERIES_KEYS, Fold

# SQLite's largest integer: a larger id or step fails in the driver, it does not match nothing.
INT64_MAX = 2**63 - 1
# The cursor "after" that no step precedes: a read from the first step (steps are >= 0).
BEFORE_FIRST_STEP = -1

__all__ = [
    "BEFORE_FIRST_STEP",
    "EXPORT_COLUMNS",
    "INT64_MAX",
    "SERIES_KEYS",
    "RunInfo",
    "Series",
    "chart_series",
    "get_run",
    "iter_step_pages",
    "list_runs",
    "parse_ranks",
    "run_status",
    "step_dict",
    "step_rows_after",
]

# The columns read for exports and live tails, by dialect: flags as 0 and 1 on both
# (PostgreSQL's are booleans; SQLite stores 0 and 1 already, and a cast per row costs).
_STEP_SELECT = {
    "sqlite": ", ".join(COLUMNS),
    "postgresql": ", ".join(
        f"CAST({c} AS INTEGER) AS {c}" if isinstance(steps.c[c].type, Boolean) else c
        for c in COLUMNS
    ),
}
# The widest level: a run's totals are the sum of its fewest rows.
_TOP_LEVEL = max(ROLLUP_LEVELS, key=ROLLUP_LEVELS.__getitem__)
# (level, width), coarsest first.
_LEVELS: tuple[tuple[int, int], ...] = tuple(
    sorted(ROLLUP_LEVELS.items(), key=lambda item: item[1], reverse=True)
)


@dataclass(frozen=True)
class RunInfo:
    """One run with the figures the run list and the metrics show."""

    id: int
    uid: str
    name: str
    status: RunStatus  # effective: a silent "running" run reads as "crashed"
    world_size: int
    steps: int  # last step reached
    recorded: int  # step rows stored
    overflows: int
    skipped: int
    scale: float | None  # scale after the last recorded step
    growth_tracker: int | None
    schedule_drift: int | None  # at the last recorded step; None: no scheduler registered
    grad_norm: float | None  # at the last recorded step; None: not recorded or not finite
    last_heartbeat: float
    started_at: float
    ended_at: float | None
    config: dict[str, Any]
    control: dict[str, Any]
    control_version: int
    dropped: int
    torch_version: str
    host: str
    pid: int

    @property
    def skipped_rate(self) -> float:
        return self.skipped / self.recorded if self.recorded else 0.0


@dataclass
class Series:
    """Columnar chart buckets over ``[start, end]``, each ``bucket_width`` steps wide."""

    run: int
    start: int | None
    end: int | None
    bucket_width: int
    columns: dict[str, list[Any]] = field(default_factory=lambda: {key: [] for key in SERIES_KEYS})


def _run_info(conn: Connection, row: RowMapping, now: float) -> RunInfo:
    run_id = row["id"]
    totals = conn.execute(
        text(
            "SELECT coalesce(sum(n), 0), coalesce(sum(overflows), 0), coalesce(sum(skipped), 0)"
            " FROM step_rollups WHERE run_id = :run AND level = :level"
        ),
        {"run": run_id, "level": _TOP_LEVEL},
    ).one()
    last = conn.execute(
        text(
            "SELECT scale_after, growth_tracker, schedule_drift, grad_norm FROM steps"
            " WHERE run_id = :run"
            " ORDER BY step DESC LIMIT 1"
        ),
        {"run": run_id},
    ).first()
    return RunInfo(
        id=run_id,
        uid=row["uid"],
        name=row["name"],
        status=effective_status(row, now),
        world_size=row["world_size"],
        steps=row["last_step"],
        recorded=int(totals[0]),
        overflows=int(totals[1]),
        skipped=int(totals[2]),
        scale=None if last is None else float(last[0]),
        growth_tracker=None if last is None else int(last[1]),
        schedule_drift=None if last is None or last[2] is None else int(last[2]),
        grad_norm=None if last is None or last[3] is None else float(last[3]),
        last_heartbeat=row["heartbeat_at"],
        started_at=row["started_at"],
        ended_at=row["ended_at"],
        config=dict(row["config"] or {}),
        control=dict(row["control"] or {}),
        control_version=row["control_version"],
        dropped=row["dropped"],
        torch_version=row["torch_version"],
        host=row["host"],
        pid=row["pid"],
    )


def _run_rows(conn: Connection, run_id: int | None) -> list[RowMapping]:
    query = runs.select().order_by(runs.c.id.desc())
    if run_id is not None:
        query = query.where(runs.c.id == run_id)
    return [row._mapping for row in conn.execute(query)]


def list_runs(store: Store, *, now: float | None = None) -> list[RunInfo]:
    """All runs, newest first."""
    now = time.time() if now is None else now
    with store.engine.connect() as conn:
        return [_run_info(conn, row, now) for row in _run_rows(conn, None)]


def get_run(store: Store, run_id: int, *, now: float | None = None) -> RunInfo | None:
    now = time.time() if now is None else now
    with store.engine.connect() as conn:
        rows = _run_rows(conn, run_id)
        return _run_info(conn, rows[0], now) if rows else None


def run_status(store: Store, run_id: int, *, now: float | None = None) -> RunStatus | None:
    """The effective status of a run, or None when there is no such run."""
    now = time.time() if now is None else now
    with store.engine.connect() as conn:
        row = conn.execute(runs.select().where(runs.c.id == run_id)).first()
    return None if row is None else effective_status(row._mapping, now)


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
_BOUNDS = (
    "SELECT (SELECT step FROM steps WHERE run_id = :run ORDER BY step ASC LIMIT 1),"
    " (SELECT step FROM steps WHERE run_id = :run ORDER BY step DESC LIMIT 1)"
)


def _step_bounds(conn: Connection, run_id: int) -> tuple[int, int] | None:
    first, last = conn.execute(text(_BOUNDS), {"run": run_id}).one()
    return None if first is None or last is None else (int(first), int(last))


def chart_series(
    store: Store,
    run_id: int,
    *,
    start: int | None = None,
    end: int | None = None,
    max_points: int = 1000,
) -> Series:
    """At most ``max_points`` buckets over steps ``[start, end]`` (default: the whole run).

    A bucket with an overflow has ``overflows > 0`` and a ``scale_min`` at or below the
    scale the overflow dropped to; narrow ranges come back one step per bucket.
    """
    if max_points < 2:
        raise ValueError("max_points must be at least 2")
    with store.engine.connect() as conn:
        bounds = _step_bounds(conn, run_id)
        if bounds is None:
            return Series(run_id, start, end, 1)
        lo = bounds[0] if start is None else max(start, bounds[0])
        hi = bounds[1] if end is None else min(end, bounds[1])
        # An end not asked for is the run's last step, or none past it (no reversed range).
        shown_end = (hi if hi >= lo else None) if end is None else end
        series = Series(run_id, lo if start is None else start, shown_end, 1)
        if lo > hi:
            return series
        width, levels = _bucket_width(hi - lo + 1, max_points)
        series.bucket_width = width
        params: dict[str, int] = {"run": run_id, "width": width}
        selects = []
        for i, (level, first, last) in enumerate(_pieces(lo, hi, levels)):
            params[f"lo{i}"], params[f"hi{i}"] = first, last
            if level:
                params[f"level{i}"] = level
                selects.append(_ROLLUP_PIECE.format(i=i))
            else:
                selects.append(_RAW_PIECE.format(i=i))
        sql = _GROUPED.format(pieces=" UNION ALL ".join(selects))
        cursor = conn.connection.cursor()  # the driver's tuples: no Row a bucket
        try:
            cursor.execute(driver_sql(sql, conn.dialect.name), params)
            rows = cursor.fetchall()
        finally:
            cursor.close()
    for key, values in zip(SERIES_KEYS, zip(*rows, strict=True), strict=False):
        series.columns[key] = list(values)
    return series


def iter_step_pages(
    store: Store,
    run_id: int,
    *,
    start: int | None = None,
    end: int | None = None,
    overflows_only: bool = False,
    page_size: int = 5000,
) -> Iterator[list[tuple[Any, ...]]]:
    """Step rows in ``EXPORT_COLUMNS`` order, a page at a time, keyset-paged on the step.

    Each page is read in its own short transaction, so a long export neither holds a
    connection nor pins the WAL between pages.
    """
    after = BEFORE_FIRST_STEP if start is None else start - 1
    last = (1 << 62) if end is None else end
    where = "run_id = :run AND step > :after AND step <= :last"
    if overflows_only:
        where += " AND overflow"
    dialect = store.engine.dialect.name
    sql = driver_sql(
        f"SELECT {_STEP_SELECT[dialect]} FROM steps WHERE {where} ORDER BY step LIMIT :limit",
        dialect,
    )
    while True:
        raw = store.engine.raw_connection()
        try:
            cursor = raw.cursor()
            cursor.execute(sql, {"run": run_id, "after": after, "last": last, "limit": page_size})
            page = list(cursor.fetchall())  # sqlite3 rows are tuples already
            cursor.close()
        finally:
            raw.close()
        if not page:
            return
        yield page
        if len(page) < page_size:
            return
        after = page[-1][0]


_ROWS_AFTER = {
    dialect: f"SELECT {columns} FROM steps WHERE run_id = :run AND step > :after"
    " AND step <= :until ORDER BY step LIMIT :limit"
    for dialect, columns in _STEP_SELECT.items()
}


def step_rows_after(
    store: Store, run_id: int, after: int, *, until: int | None = None, limit: int = 1000
) -> list[tuple[Any, ...]]:
    """Raw step rows after ``after`` (and at most ``until``) in ``EXPORT_COLUMNS`` order,
    oldest first: sqlite3's own tuples, for a live tail that formats many rows a second."""
    raw = store.engine.raw_connection()
    try:
        cursor = raw.cursor()
        cursor.execute(
            driver_sql(_ROWS_AFTER[store.engine.dialect.name], store.engine.dialect.name),
            {
                "run": run_id,
                "after": after,
                "until": INT64_MAX if until is None else until,
                "limit": limit,
            },
        )
        rows: list[tuple[Any, ...]] = list(cursor.fetchall())  # tuples already
        cursor.close()
    finally:
        raw.close()
    return rows


def last_step(store: Store, run_id: int) -> int | None:
    with store.engine.connect() as conn:
        bounds = _step_bounds(conn, run_id)
    return None if bounds is None else bounds[1]
