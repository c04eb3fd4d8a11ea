"""Read queries for the service: runs, exports, live tails (chart series:
:mod:`scalewatch.store.charts`; overflow pages and their parameters:
:mod:`scalewatch.store.diagnosis`)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Boolean, Connection, RowMapping, text

from .charts import Series, chart_series, step_bounds
from .engine import Store
from .runs import effective_status
from .schema import ROLLUP_LEVELS, runs, steps
from .states import RunStatus
from .step_rows import COLUMNS, EXPORT_COLUMNS, parse_ranks, step_dict
from .step_schema import SERIES_KEYS

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
    columns = _STEP_SELECT[store.engine.dialect.name]
    sql = f"SELECT {columns} FROM steps WHERE {where} ORDER BY step LIMIT :limit"
    while True:
        params = {"run": run_id, "after": after, "last": last, "limit": page_size}
        page = store.driver_rows(sql, params)
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
    return store.driver_rows(
        _ROWS_AFTER[store.engine.dialect.name],
        {
            "run": run_id,
            "after": after,
            "until": INT64_MAX if until is None else until,
            "limit": limit,
        },
    )


def last_step(store: Store, run_id: int) -> int | None:
    with store.engine.connect() as conn:
        bounds = step_bounds(conn, run_id)
    return None if bounds is None else bounds[1]
