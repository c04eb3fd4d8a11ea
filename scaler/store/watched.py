"""What the service's alert evaluator reads of the store, once a tick in a worker
thread: every run with what its autopilot says, a run's recorded last step, and the new
steps of many runs at once.

>>> from scalewatch.store.engine import open_store
>>> from scalewatch.store.runs import create_run
>>> store = open_store("sqlite://")
>>> run = create_run(store, name="demo", world_size=2, config={}, control={})
>>> [(r.name, r.status, r.world_size, r.autopilot_gave_up) for r in watched_runs(store)]
[('demo', 'running', 2, None)]
>>> held = create_run(store, name="held", world_size=1, config={"min_scale": 128}, control={})
>>> [r.min_scale for r in watched_runs(store)]
[None, 128.0]
>>> recorded_last_step(store, run.id), new_steps(store, {run.id: 0}, per_run=10)
(0, [])
>>> store.close()
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from sqlalchemy import and_, case, func, select

from .engine import Store
from .schema import autopilots, runs
from .sql import driver_sql
from .states import AutopilotState

__all__ = [
    "RUNS_PER_READ",
    "WATCHED_COLUMNS",
    "WatchedRun",
    "new_steps",
    "recorded_last_step",
    "watched_runs",
]


@dataclass(frozen=True, kw_only=True)
class WatchedRun:
    """A run as the evaluator looks at it each tick."""

    id: int
    name: str
    status: str  # as stored: a silent job still reads as running
    world_size: int
    started_at: float
    autopilot_gave_up: str | None  # its reason, while the run's autopilot has stopped itself
    min_scale: float | None = None  # the scaler's min_scale, where it was made with one


_GAVE_UP = and_(autopilots.c.enabled, autopilots.c.state == AutopilotState.GAVE_UP)
_RUNS = (
    select(
        runs.c.id,
        runs.c.name,
        runs.c.status,
        runs.c.world_size,
        runs.c.started_at,
        runs.c.config,
        case((_GAVE_UP, func.coalesce(autopilots.c.reason, "")), else_=None).label("gave_up"),
    )
    .outerjoin(autopilots, autopilots.c.run_id == runs.c.id)
    .order_by(runs.c.id)
)


def watched_runs(store: Store) -> list[WatchedRun]:
    """Every run, oldest first, with the reason its autopilot gave up (None: it has not)."""
    with store.read() as conn:
        rows = conn.execute(_RUNS).all()
    return [
        WatchedRun(
            id=row.id,
            name=row.name,
            status=row.status,
            world_size=row.world_size,
            started_at=row.started_at,
            autopilot_gave_up=row.gave_up,
            min_scale=_min_scale(row.config),
        )
        for row in rows
    ]


def _min_scale(config: Any) -> float | None:
    """A run configuration's ``min_scale``, if it is a positive number."""
    value = config.get("min_scale") if isinstance(config, Mapping) else None
    if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
        return None
    return float(value)


def recorded_last_step(store: Store, run_id: int) -> int:
    """The run's last step as its row records it (0: none yet, or no such run)."""
    with store.read() as conn:
        last = conn.execute(select(runs.c.last_step).where(runs.c.id == run_id)).scalar()
    return int(last or 0)


# What the rules read of a step, and its run.
WATCHED_COLUMNS: tuple[str, ...] = (
    "run_id",
    "step",
    "wall_time",
    "scale",
    "scale_after",
    "overflow",
    "skipped",
    "inf_ranks",
    "schedule_drift",
    "loss_spike",
    "grad_norm_spike",
)
# Runs asked for in one statement (a sub-select each), unless the caller says.
RUNS_PER_READ = 50


def new_steps(
    store: Store, cursors: Mapping[int, int], *, per_run: int, runs_per_read: int = RUNS_PER_READ
) -> list[tuple[Any, ...]]:
    """The steps after each run's cursor (``run id -> last step read``), at most
    ``per_run`` of each, as tuples of ``WATCHED_COLUMNS``, by run and step: one statement
    for up to ``runs_per_read`` runs (a statement a run costs a round trip each on a
    server store), read through the driver's cursor (a tuple a row, nothing more).

    Each run is its own sub-select on the primary key, as a chart's read is: one filter
    over all the runs, ordered and limited, lets a planner walk the whole index instead.
    """
    wanted = sorted(cursors.items())
    dialect = store.engine.dialect.name
    rows: list[tuple[Any, ...]] = []
    raw = store.engine.raw_connection()
    try:
        cursor = raw.cursor()
        for first in range(0, len(wanted), runs_per_read):
            part = wanted[first : first + runs_per_read]
            params: dict[str, int] = {"limit": per_run}
            for i, (run, after) in enumerate(part):
                params[f"run{i}"], params[f"after{i}"] = run, after
            sql = " UNION ALL ".join(_ONE_RUN.format(i=i) for i in range(len(part)))
            cursor.execute(driver_sql(f"{sql} ORDER BY run_id, step", dialect), params)
            rows += cursor.fetchall()
        cursor.close()
    finally:
        raw.close()
    return rows


_ONE_RUN = (
    f"SELECT * FROM (SELECT {', '.join(WATCHED_COLUMNS)} FROM steps"
    " WHERE run_id = :run{i} AND step > :after{i} ORDER BY step LIMIT :limit) AS r{i}"
)
