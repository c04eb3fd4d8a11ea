"""Writes of a training run: its row, heartbeats, step records with their rollups, gaps.

The trainer's telemetry thread is the one writer of a run's steps; every function here
is one write transaction.
"""

from __future__ import annotations

import importlib.metadata
import os
import socket
import time
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from itertools import pairwise
from typing import Any

from sqlalchemy import Connection, RowMapping, exc, select, update

from . import postgres
from .engine import Store
from .errors import RunNotFound
from .records import FindingKind, RunRef, StepRecord
from .rollups import contiguous, refresh_rollups
from .schema import (
    PARAM_NAME_LENGTH,
    control_requests,
    overflow_params,
    runs,
    telemetry_gaps,
)
from .spike_store import write_spikes
from .sql import driver_sql
from .sqlite import insert_rows
from .states import RequestStatus, RunStatus
from .step_rows import COLUMNS, step_values

__all__ = [
    "HEARTBEAT_INTERVAL_S",
    "HEARTBEAT_TIMEOUT_S",
    "Appended",
    "create_run",
    "effective_status",
    "end_run",
    "finding_rows",
    "heartbeat",
    "norm_rows",
    "record_gap",
    "resume_run",
    "step_rows",
    "step_values",
    "write_step_values",
    "write_steps",
]

HEARTBEAT_TIMEOUT_S = 15.0
HEARTBEAT_INTERVAL_S = 2.0

# The columns of ``steps`` in table order: ``run_id`` then the fields the step schema declares.
_STEP_COLUMNS: tuple[str, ...] = ("run_id", *COLUMNS)
_INSERT = f"INSERT INTO steps ({', '.join(_STEP_COLUMNS)})"
_INSERT_OR_REPLACE = f"INSERT OR REPLACE INTO steps ({', '.join(_STEP_COLUMNS)})"
_LAST_STEP = "SELECT last_step FROM runs WHERE id = ?"
_ADVANCE = "UPDATE runs SET last_step = GREATEST(last_step, ?), heartbeat_at = ? WHERE id = ?"
_ADVANCE_SEQUENCE = "UPDATE runs SET batch_sequence = ? WHERE id = ? AND batch_sequence < ?"
_REWRITTEN = "UPDATE runs SET step_rewrites = step_rewrites + 1 WHERE id = ?"
_FINDING_COLUMNS: tuple[str, ...] = tuple(column.name for column in overflow_params.c)
_FINDING_KEY = ("run_id", "step", "rank", "name")
_INSERT_FINDINGS = f"INSERT OR REPLACE INTO overflow_params ({', '.join(_FINDING_COLUMNS)})"
_DELETE_FINDINGS = "DELETE FROM overflow_params WHERE run_id = ? AND step >= ? AND step <= ?"
FINDING_KINDS = frozenset(FindingKind)


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
    started_at: float | None = None,
    owner: str | None = None,
    host: str | None = None,
    pid: int | None = None,
) -> RunRef:
    """Insert a running run owned by this process; ``uid`` defaults to a fresh UUID (hex).

    ``started_at`` (default: now) is when recording began: a trainer's writer creates the
    row after its first steps were taken, and a run starts at or before its first step.
    ``owner``, ``host``, ``pid``: for a run a job creates through the service, the identity
    that created it and the job's host and process (default: this process's).
    """
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")
    uid = uid or uuid.uuid4().hex
    now = time.time()
    values = {
        "uid": uid,
        "name": name,
        "status": RunStatus.RUNNING,
        "world_size": world_size,
        "config": dict(config),
        "control": dict(control),
        "control_version": 0,
        "torch_version": torch_version or _torch_version(),
        "host": socket.gethostname() if host is None else host,
        "pid": os.getpid() if pid is None else pid,
        "started_at": now if started_at is None else min(started_at, now),
        "ended_at": None,
        "heartbeat_at": now,
        "last_step": 0,
        "dropped": 0,
        **({} if owner is None else {"owner": owner}),
    }
    try:
        with store.write() as conn:
            result = conn.execute(runs.insert().values(values))
    except exc.IntegrityError as error:
        raise ValueError(f"a run with uid {uid!r} exists already; resume it instead") from error
    key = result.inserted_primary_key
    assert key is not None  # an INSERT of one row always has one
    return RunRef(id=int(key[0]), uid=uid)


def resume_run(
    store: Store, uid: str, *, host: str | None = None, pid: int | None = None
) -> RunRef | None:
    """Mark the run ``uid`` running again, owned by this process (or by the job on ``host``
    as ``pid``); ``None`` if there is none.

    Control requests left pending by a run that crashed are rejected, not applied late.
    """
    now = time.time()
    with store.write() as conn:
        row = conn.execute(
            select(runs.c.id, runs.c.status, runs.c.heartbeat_at).where(runs.c.uid == uid)
        ).first()
        if row is None:
            return None
        run_id = row.id
        if effective_status(row._mapping, now) is RunStatus.CRASHED:
            _reject_pending(conn, run_id, now, RunStatus.CRASHED)
        conn.execute(
            update(runs)
            .where(runs.c.id == run_id)
            .values(
                status=RunStatus.RUNNING,
                ended_at=None,
                heartbeat_at=now,
                host=socket.gethostname() if host is None else host,
                pid=os.getpid() if pid is None else pid,
            )
        )
    return RunRef(id=int(run_id), uid=uid)


def heartbeat(store: Store, run_id: int, at: float | None = None) -> None:
    """Record that the run's writer is alive at ``at`` (default: now)."""
    with store.write() as conn:
        _update_run(conn, run_id, heartbeat_at=time.time() if at is None else at)


def end_run(store: Store, run_id: int, status: str = RunStatus.FINISHED) -> None:
    """Mark the run ``finished`` or ``crashed``; its pending control requests are rejected."""
    if status not in (RunStatus.FINISHED, RunStatus.CRASHED):
        raise ValueError(f"a run ends as 'finished' or 'crashed', not {status!r}")
    status = RunStatus(status)
    now = time.time()
    with store.write() as conn:
        _update_run(conn, run_id, status=status, ended_at=now, heartbeat_at=now)
        _reject_pending(conn, run_id, now, status)


def _reject_pending(conn: Connection, run_id: int, now: float, status: str) -> None:
    conn.execute(
        update(control_requests)
        .where(
            control_requests.c.run_id == run_id,
            control_requests.c.status == RequestStatus.PENDING,
        )
        .values(status=RequestStatus.REJECTED, applied_at=now, reason=ended_first(status))
    )


def ended_first(status: str) -> str:
    """Why a request still pending when its run ended was not applied."""
    return f"the run {status} first"


def effective_status(row: Mapping[str, Any] | RowMapping, now: float | None = None) -> RunStatus:
    """A run's status as readers should show it: ``running`` with a stale heartbeat is crashed.

    >>> effective_status({"status": "running", "heartbeat_at": 100.0}, now=120.0)
    <RunStatus.CRASHED: 'crashed'>
    """
    status = RunStatus(row["status"])
    now = time.time() if now is None else now
    if status is RunStatus.RUNNING and now - float(row["heartbeat_at"]) > HEARTBEAT_TIMEOUT_S:
        return RunStatus.CRASHED
    return status


def norm_rows(records: Iterable[StepRecord]) -> list[tuple[Any, ...]]:
    """The largest parameter norms of ``records`` as :func:`write_step_values` takes them:
    ``(step, position, name, norm)``, record by record (kept for the steps that overflowed
    or spiked)."""
    return [
        (r.step, position, name, norm)
        for r in records
        for position, (name, norm) in enumerate(r.param_norms)
    ]


def finding_rows(records: Iterable[StepRecord]) -> list[tuple[Any, ...]]:
    """The parameter findings of ``records`` as :func:`write_step_values` takes them:
    ``(step, rank, name, kind, count)``, record by record."""
    return [(r.step, p.rank, p.name, p.kind, p.count) for r in records for p in r.params]


@dataclass(frozen=True, slots=True)
class Appended:
    """Steps a write added after a run's last one, in step order: ``after``, the run's
    last step before the write, and the ``rows`` stored, in the ``steps`` columns' order
    without ``run_id`` (as a live tail reads them back)."""

    after: int
    rows: list[tuple[Any, ...]]


def step_rows(run_id: int, records: Sequence[StepRecord]) -> list[tuple[Any, ...]]:
    """``records`` as rows of the ``steps`` table, in its column order."""
    return [(run_id, *step_values(r)) for r in records]


def write_steps(store: Store, run_id: int, records: Sequence[StepRecord]) -> None:
    """Store ``records`` (and their parameter findings) and refresh the rollups of their
    buckets, in one transaction.

    Also advances ``runs.last_step`` and the heartbeat. Writing a step again replaces it
    and its findings, so a retried batch leaves the same rows and rollups as one write, and
    counts in ``runs.step_rewrites``.
    """
    write_step_values(
        store, run_id, [step_values(r) for r in records], finding_rows(records), norm_rows(records)
    )


def write_step_values(
    store: Store,
    run_id: int,
    values: Sequence[tuple[Any, ...]],
    findings: Sequence[tuple[Any, ...]] = (),
    norms: Sequence[tuple[Any, ...]] = (),
    *,
    sequence: int | None = None,
    appended: bool = False,
) -> Appended | None:
    """:func:`write_steps` of records already turned into :func:`step_values`, their
    findings into :func:`finding_rows` and their largest parameter norms into
    :func:`norm_rows`. The steps' loss and gradient-norm spikes are found and stored in
    the same transaction (:mod:`.spike_store`); so is ``sequence``, the job's last batch
    stored (:func:`~.batches.advance_sequence`), when given.

    With ``appended``, returns, once committed, the rows it stored when they all follow
    the run's last step in order (the service hands them to its live streams); None
    otherwise."""
    if not values:
        return None
    step_numbers = [row[0] for row in values]
    if min(step_numbers) < 0:
        raise ValueError("step numbers are >= 0")
    rows = [(run_id, *row) for row in values]
    found_rows = _finding_rows(run_id, step_numbers, findings) if findings else []
    with store.write() as conn:
        dialect = conn.dialect.name
        # The driver's own cursor: SQLAlchemy's work per statement was a third of the write.
        cursor = conn.connection.cursor()
        try:
            newest, now = max(step_numbers), time.time()
            if dialect == "postgresql":  # one trip: the run's last step read and advanced
                cursor.execute(
                    postgres.ADVANCE_AND_NOTIFY, (run_id, newest, now, run_id, str(run_id))
                )
            else:
                cursor.execute(driver_sql(_LAST_STEP, dialect), (run_id,))
            found = cursor.fetchone()
            if found is None:
                raise RunNotFound(run_id)
            fresh = min(step_numbers) > found[0] and len(set(step_numbers)) == len(step_numbers)
            rows = write_spikes(cursor, run_id, rows, norms, dialect=dialect, fresh=fresh)
            _insert_steps(cursor, rows, replace=not fresh, dialect=dialect)
            if not fresh:  # a step written again loses the findings it had
                for first, last in contiguous(set(step_numbers)):
                    cursor.execute(driver_sql(_DELETE_FINDINGS, dialect), (run_id, first, last))
                cursor.execute(driver_sql(_REWRITTEN, dialect), (run_id,))
            if found_rows:
                _insert_findings(cursor, found_rows, dialect=dialect)
            refresh_rollups(cursor, run_id, rows, fresh=fresh)
            if dialect != "postgresql":
                cursor.execute(driver_sql(_ADVANCE, dialect), (newest, now, run_id))
            if sequence is not None:
                cursor.execute(driver_sql(_ADVANCE_SEQUENCE, dialect), (sequence, run_id, sequence))
        finally:
            cursor.close()
    if not appended or not fresh or any(a > b for a, b in pairwise(step_numbers)):
        return None
    return Appended(after=found[0], rows=[row[1:] for row in rows])


def _finding_rows(
    run_id: int, step_numbers: Sequence[int], findings: Sequence[tuple[Any, ...]]
) -> list[tuple[Any, ...]]:
    """``findings`` as ``overflow_params`` rows, checked against the steps written with them.

    A name longer than the column is cut to fit; the same parameter twice on one rank of a
    step (a step twice in a batch) keeps the later.
    """
    written = set(step_numbers)
    rows = []
    for step, rank, name, kind, count in findings:
        if step not in written:
            raise ValueError(f"a finding of step {step}, which is not in the batch")
        if kind not in FINDING_KINDS:
            raise ValueError(f"a finding's kind is inf, nan or both, not {kind!r}")
        if rank < 0 or count < 0:
            raise ValueError("a finding's rank and count are >= 0")
        rows.append((run_id, step, rank, str(name)[:PARAM_NAME_LENGTH], str(kind), count))
    return rows


def _insert_findings(cursor: Any, rows: Sequence[tuple[Any, ...]], *, dialect: str) -> None:
    if dialect == "sqlite":
        insert_rows(cursor, _INSERT_FINDINGS, rows)
    else:
        postgres.upsert_rows(cursor, "overflow_params", _FINDING_COLUMNS, _FINDING_KEY, rows)


def _insert_steps(
    cursor: Any, rows: Sequence[tuple[Any, ...]], *, replace: bool, dialect: str
) -> None:
    """Insert ``rows``; a step written again replaces the stored row when ``replace``.

    Steps are written again by a retried batch, or replayed after resuming from an older
    checkpoint; their buckets are then recomputed from what is stored. On PostgreSQL new
    steps go in by COPY, the fastest way in.
    """
    if dialect == "sqlite":
        insert_rows(cursor, _INSERT_OR_REPLACE if replace else _INSERT, rows)
    elif replace:
        postgres.upsert_rows(cursor, "steps", _STEP_COLUMNS, ("run_id", "step"), rows)
    else:
        postgres.copy_rows(cursor, "steps", _STEP_COLUMNS, rows)


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
