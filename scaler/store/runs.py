"""Writes of a training run: its row, heartbeats, step records with their rollups, gaps.

The trainer's telemetry thread is the one writer of a run's steps; every function here
is one write transaction.
"""

from __future__ import annotations

import functools
import importlib.metadata
import os
import socket
import time
import uuid
from bisect import bisect_left
from collections.abc import Mapping, Sequence
from itertools import chain
from operator import itemgetter
from typing import Any

from sqlalchemy import Connection, RowMapping, exc, select, update

from scaler.store.engine import Store
from scaler.store.errors import RunNotFound
from scaler.store.records import RunRef, StepRecord, format_inf_ranks
from scaler.store.schema import ROLLUP_LEVELS, control_requests, runs, steps, telemetry_gaps

__all__ = [
    "HEARTBEAT_INTERVAL_S",
    "HEARTBEAT_TIMEOUT_S",
    "RUN_STATUSES",
    "create_run",
    "effective_status",
    "end_run",
    "heartbeat",
    "record_gap",
    "resume_run",
    "step_rows",
    "write_steps",
]

HEARTBEAT_TIMEOUT_S = 15.0
HEARTBEAT_INTERVAL_S = 2.0
RUN_STATUSES = ("running", "finished", "crashed")

# The columns of ``steps`` in table order: ``run_id`` then the fields of ``StepRecord``.
_STEP_COLUMNS: tuple[str, ...] = tuple(column.name for column in steps.c)
# Rows go in several to a statement: executemany releases and retakes the GIL around every
# row, and each time the training thread may have to hand it over. 64 rows x 13 columns
# stay under the oldest SQLite's limit of 999 parameters.
_ROWS_PER_STATEMENT = 64

_ROLLUP_COLUMNS = (
    "run_id, level, bucket, first_step, last_step, n, scale_min, scale_max, scale_last,"
    " tracker_min, tracker_max, tracker_last, overflows, skipped"
)
# Aliases are prefixed: SQLite resolves a bare name in WHERE/GROUP BY to a result alias.
# Run on the driver's cursor, which takes the named parameters as they are.
_ROLLUP_FROM_STEPS = (
    f"INSERT OR REPLACE INTO step_rollups ({_ROLLUP_COLUMNS})"
    " SELECT :run, :level, a.agg_bucket, a.agg_first, a.agg_last, a.agg_n,"
    " a.agg_scale_min, a.agg_scale_max, s.scale_after,"
    " a.agg_tracker_min, a.agg_tracker_max, s.growth_tracker, a.agg_overflows, a.agg_skipped"
    " FROM (SELECT step / :width AS agg_bucket, min(step) AS agg_first,"
    " max(step) AS agg_last, count(*) AS agg_n,"
    " min(min(scale), min(scale_after)) AS agg_scale_min,"
    " max(max(scale), max(scale_after)) AS agg_scale_max,"
    " min(growth_tracker) AS agg_tracker_min, max(growth_tracker) AS agg_tracker_max,"
    " sum(overflow) AS agg_overflows, sum(skipped) AS agg_skipped"
    " FROM steps WHERE run_id = :run AND step >= :lo AND step < :hi"
    " GROUP BY step / :width) AS a"
    " JOIN steps AS s ON s.run_id = :run AND s.step = a.agg_last"
)
_ROLLUP_FROM_CHILD = (
    f"INSERT OR REPLACE INTO step_rollups ({_ROLLUP_COLUMNS})"
    " SELECT :run, :level, a.agg_bucket, a.agg_first, a.agg_last, a.agg_n,"
    " a.agg_scale_min, a.agg_scale_max, c.scale_last,"
    " a.agg_tracker_min, a.agg_tracker_max, c.tracker_last, a.agg_overflows, a.agg_skipped"
    " FROM (SELECT bucket / :ratio AS agg_bucket, min(first_step) AS agg_first,"
    " max(last_step) AS agg_last, sum(n) AS agg_n,"
    " min(scale_min) AS agg_scale_min, max(scale_max) AS agg_scale_max,"
    " min(tracker_min) AS agg_tracker_min, max(tracker_max) AS agg_tracker_max,"
    " sum(overflows) AS agg_overflows, sum(skipped) AS agg_skipped"
    " FROM step_rollups WHERE run_id = :run AND level = :child AND bucket >= :lo AND bucket < :hi"
    " GROUP BY bucket / :ratio) AS a"
    " JOIN step_rollups AS c ON c.run_id = :run AND c.level = :child"
    " AND c.bucket = a.agg_last / :child_width"
)

_ROLLUP_ROW = (
    "SELECT first_step, n, scale_min, scale_max, tracker_min, tracker_max, overflows, skipped"
    " FROM step_rollups WHERE run_id = ? AND level = ? AND bucket = ?"
)
_ROLLUP_INSERT = (
    f"INSERT OR REPLACE INTO step_rollups ({_ROLLUP_COLUMNS}) VALUES ({', '.join('?' * 14)})"
)


def _rollup_plan() -> tuple[tuple[int, int, int | None, int], ...]:
    """``(level, width, child level or None, child width)``, finest first.

    A level whose width is a multiple of the next finer one is merged from that level's
    rows (at most width/child_width of them per bucket) instead of from ``steps``.
    """
    plan: list[tuple[int, int, int | None, int]] = []
    for level, width in sorted(ROLLUP_LEVELS.items(), key=lambda item: item[1]):
        child = plan[-1] if plan else None
        if child is not None and width % child[1] == 0:
            plan.append((level, width, child[0], child[1]))
        else:
            plan.append((level, width, None, 1))
    return tuple(plan)


_ROLLUP_PLAN = _rollup_plan()


def _torch_version() -> str:
    try:
        return importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def create_run(
    store: Store,
    *,
    name: str,
    world_size: int,
    config: Mapping[str, Any],
    control: Mapping[str, Any],
    uid: str | None = None,
    torch_version: str | None = None,
) -> RunRef:
    """Insert a running run owned by this process; ``uid`` defaults to a fresh UUID (hex)."""
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")
    uid = uid or uuid.uuid4().hex
    now = time.time()
    values = {
        "uid": uid,
        "name": name,
        "status": "running",
        "world_size": world_size,
        "config": dict(config),
        "control": dict(control),
        "control_version": 0,
        "torch_version": torch_version or _torch_version(),
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "started_at": now,
        "ended_at": None,
        "heartbeat_at": now,
        "last_step": 0,
        "dropped": 0,
    }
    try:
        with store.write() as conn:
            result = conn.execute(runs.insert().values(values))
    except exc.IntegrityError as error:
        raise ValueError(f"a run with uid {uid!r} exists already; resume it instead") from error
    key = result.inserted_primary_key
    assert key is not None  # an INSERT of one row always has one
    return RunRef(id=int(key[0]), uid=uid)


def resume_run(store: Store, uid: str) -> RunRef | None:
    """Mark the run ``uid`` running again, owned by this process; ``None`` if there is none."""
    now = time.time()
    with store.write() as conn:
        run_id = conn.execute(select(runs.c.id).where(runs.c.uid == uid)).scalar_one_or_none()
        if run_id is None:
            return None
        conn.execute(
            update(runs)
            .where(runs.c.id == run_id)
            .values(
                status="running",
                ended_at=None,
                heartbeat_at=now,
                host=socket.gethostname(),
                pid=os.getpid(),
            )
        )
    return RunRef(id=int(run_id), uid=uid)


def heartbeat(store: Store, run_id: int, at: float | None = None) -> None:
    """Record that the run's writer is alive at ``at`` (default: now)."""
    with store.write() as conn:
        _update_run(conn, run_id, heartbeat_at=time.time() if at is None else at)


def end_run(store: Store, run_id: int, status: str = "finished") -> None:
    """Mark the run ``finished`` or ``crashed``; its pending control requests are rejected."""
    if status not in ("finished", "crashed"):
        raise ValueError(f"a run ends as 'finished' or 'crashed', not {status!r}")
    now = time.time()
    with store.write() as conn:
        _update_run(conn, run_id, status=status, ended_at=now, heartbeat_at=now)
        conn.execute(
            update(control_requests)
            .where(control_requests.c.run_id == run_id, control_requests.c.status == "pending")
            .values(status="rejected", applied_at=now, reason=f"the run {status} first")
        )


def effective_status(row: Mapping[str, Any] | RowMapping, now: float | None = None) -> str:
    """A run's status as readers should show it: ``running`` with a stale heartbeat is crashed.

    >>> effective_status({"status": "running", "heartbeat_at": 100.0}, now=120.0)
    'crashed'
    """
    status: str = row["status"]
    now = time.time() if now is None else now
    if status == "running" and now - float(row["heartbeat_at"]) > HEARTBEAT_TIMEOUT_S:
        return "crashed"
    return status


def step_rows(run_id: int, records: Sequence[StepRecord]) -> list[tuple[Any, ...]]:
    """``records`` as rows of the ``steps`` table, in its column order."""
    return [
        (
            run_id,
            r.step,
            r.wall_time,
            r.scale,
            r.overflow,
            r.skipped,
            format_inf_ranks(r.inf_ranks) if r.inf_ranks else "",
            r.scale_after,
            r.growth_tracker,
            r.growth_interval,
            r.growth_factor,
            r.backoff_factor,
            r.control_version,
        )
        for r in records
    ]


def write_steps(store: Store, run_id: int, records: Sequence[StepRecord]) -> None:
    """Store ``records`` and refresh the rollups of their buckets, in one transaction.

    Also advances ``runs.last_step`` and the heartbeat. Writing a step again replaces it,
    so a retried batch leaves the same rows and rollups as one write.
    """
    if not records:
        return
    rows = step_rows(run_id, records)
    step_numbers = [r.step for r in records]
    if min(step_numbers) < 0:
        raise ValueError("step numbers are >= 0")
    with store.write() as conn:
        # The driver's own cursor: SQLAlchemy's work per statement was a third of the write.
        cursor = conn.connection.cursor()
        try:
            cursor.execute("SELECT last_step FROM runs WHERE id = ?", (run_id,))
            found = cursor.fetchone()
            if found is None:
                raise RunNotFound(run_id)
            fresh = min(step_numbers) > found[0] and len(set(step_numbers)) == len(step_numbers)
            _insert_steps(cursor, rows, replace=not fresh)
            _refresh_rollups(cursor, run_id, rows, fresh=fresh)
            cursor.execute(
                "UPDATE runs SET last_step = max(last_step, ?), heartbeat_at = ? WHERE id = ?",
                (max(step_numbers), time.time(), run_id),
            )
        finally:
            cursor.close()


def _insert_steps(cursor: Any, rows: Sequence[tuple[Any, ...]], *, replace: bool) -> None:
    """Insert ``rows`` in statements of 64, 32, ... 1 rows (a few statements, all cached).

    A step written again (a retried batch, or steps replayed after resuming from an older
    checkpoint) replaces the stored row when ``replace``; its buckets are then recomputed
    from what is stored.
    """
    start = 0
    while start < len(rows):
        count = min(_ROWS_PER_STATEMENT, 1 << ((len(rows) - start).bit_length() - 1))
        part = rows[start : start + count]
        cursor.execute(_insert_sql(count, replace), tuple(chain.from_iterable(part)))
        start += count


@functools.cache
def _insert_sql(rows: int, replace: bool) -> str:
    """``_insert_sql(2, False)``: ``INSERT INTO steps (run_id, ...) VALUES (?, ...), (?, ...)``."""
    verb = "INSERT OR REPLACE" if replace else "INSERT"
    row = f"({', '.join('?' * len(_STEP_COLUMNS))})"
    return f"{verb} INTO steps ({', '.join(_STEP_COLUMNS)}) VALUES {', '.join([row] * rows)}"


def _refresh_rollups(
    cursor: Any, run_id: int, rows: Sequence[tuple[Any, ...]], *, fresh: bool
) -> None:
    """Recompute the rollup buckets that ``rows`` (just written) fall in, finest level first.

    Steps after every stored one (``fresh``, the writer's usual batch) are folded into the
    finest level on the host, which reads no steps back; otherwise the buckets are
    recomputed from what ``steps`` holds. Coarser levels merge their finer level's rows.
    """
    touched: set[int] = set()
    for level, width, child, child_width in _ROLLUP_PLAN:
        if child is None and fresh:
            touched = _fold_new_steps(cursor, run_id, level, width, rows)
            continue
        if child is None:
            touched = {row[1] // width for row in rows}
            statement, unit = _ROLLUP_FROM_STEPS, width
        else:
            touched = {bucket * child_width // width for bucket in touched}
            statement, unit = _ROLLUP_FROM_CHILD, width // child_width
        for first, last in _contiguous(touched):
            cursor.execute(
                statement,
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


def _fold_new_steps(
    cursor: Any, run_id: int, level: int, width: int, rows: Sequence[tuple[Any, ...]]
) -> set[int]:
    """Write the ``level`` rollups of ``rows``, all of them after every stored step.

    Only the first bucket can hold stored steps; its stored rollup row covers exactly
    those, so it is merged with the new ones. Returns the buckets written.
    """
    # The batch's columns, in step order (a transpose costs less than a pass per column).
    _, numbers, _, scale, overflow, skipped, _, after, tracker, *_ = zip(
        *sorted(rows, key=itemgetter(1)), strict=True
    )
    rollups: list[list[Any]] = []
    start = 0
    while start < len(numbers):
        bucket = numbers[start] // width
        end = bisect_left(numbers, (bucket + 1) * width, start)
        last = end - 1
        rollups.append(
            [
                run_id,
                level,
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
            ]
        )
        start = end
    cursor.execute(_ROLLUP_ROW, (run_id, level, rollups[0][2]))
    stored = cursor.fetchone()
    if stored is not None:
        head = rollups[0]
        head[3] = stored[0]
        head[5] += stored[1]
        head[6] = min(head[6], stored[2])
        head[7] = max(head[7], stored[3])
        head[9] = min(head[9], stored[4])
        head[10] = max(head[10], stored[5])
        head[12] += stored[6]
        head[13] += stored[7]
    cursor.executemany(_ROLLUP_INSERT, rollups)
    return {rollup[2] for rollup in rollups}


def _contiguous(values: set[int]) -> list[tuple[int, int]]:
    """``{1, 2, 3, 7}`` -> ``[(1, 3), (7, 7)]``."""
    ranges: list[tuple[int, int]] = []
    for value in sorted(values):
        if ranges and value == ranges[-1][1] + 1:
            ranges[-1] = (ranges[-1][0], value)
        else:
            ranges.append((value, value))
    return ranges


def record_gap(
    store: Store, run_id: int, first_step: int, last_step: int, dropped: int, reason: str
) -> None:
    """Record that ``dropped`` records of steps ``first_step..last_step`` were lost, and why."""
    if dropped < 0 or last_step < first_step:
        raise ValueError("a gap needs first_step <= last_step and dropped >= 0")
    with store.write() as conn:
        _update_run(conn, run_id, dropped=runs.c.dropped + dropped)
        conn.execute(
            telemetry_gaps.insert().values(
                run_id=run_id,
                first_step=first_step,
                last_step=last_step,
                dropped=dropped,
                recorded_at=time.time(),
                reason=reason,
            )
        )


def _update_run(conn: Connection, run_id: int, **values: Any) -> None:
    if conn.execute(update(runs).where(runs.c.id == run_id).values(**values)).rowcount == 0:
        raise RunNotFound(run_id)
