"""Runtime control requests: validation, the pending queue, and the audit trail.

A request is validated against the values in effect, stored ``pending``, picked up by the
run's reporting rank, and marked ``applied`` (with the step) or ``rejected`` (with why, as
``reason``; the requester's own why, ``note``, stays).

>>> validate_control({"growth_interval": 500.0}, {"min_scale": None, "max_scale": None})
{'growth_interval': 500}
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from sqlalchemy import Connection, Row, RowMapping, select, update

from .control_rules import EMPTY, FIELDS, RULES, UNKNOWN, bounds_problems, normalise
from .engine import Store
from .errors import (
    ControlValidationError,
    RequestNotFound,
    RunNotFound,
    RunNotRunning,
)
from .records import ControlRequestRow
from .runs import effective_status, ended_first
from .schema import control_requests, runs
from .sql import driver_sql
from .states import RequestSource, RequestStatus, RunStatus

__all__ = [
    "ANY_PENDING",
    "CONTROL_FIELDS",
    "CONTROL_SOURCES",
    "ControlValidationError",
    "HistoryPage",
    "RequestNotFound",
    "RunNotFound",
    "RunNotRunning",
    "control_history",
    "control_history_page",
    "control_request",
    "control_state",
    "file_request",
    "mark_applied",
    "mark_rejected",
    "pending_in",
    "pending_requests",
    "record_code_change",
    "request_control",
    "validate_control",
]

CONTROL_FIELDS = FIELDS
CONTROL_SOURCES = tuple(RequestSource)


def validate_control(values: Mapping[str, object], current: Mapping[str, object]) -> dict[str, Any]:
    """Check requested control ``values`` against the values in effect (``current``).

    Returns the values normalised (integral fields as ``int``, the others ``float``), in
    ``CONTROL_FIELDS`` order; raises :class:`ControlValidationError` naming every bad field.
    """
    if not isinstance(values, Mapping):
        raise ControlValidationError({"request": "a request is an object of control fields"})
    errors: dict[str, str] = {str(f): UNKNOWN for f in values if f not in CONTROL_FIELDS}
    if not values:
        errors["request"] = EMPTY
    clean: dict[str, Any] = {}
    for field in CONTROL_FIELDS:
        if field in values:
            checked = normalise(field, values[field])
            if checked is None:
                errors[field] = RULES[field]
            else:
                clean[field] = checked
    errors.update(bounds_problems(clean, current))
    if errors:
        raise ControlValidationError(errors)
    return clean


def request_control(
    store: Store,
    run_id: int,
    values: Mapping[str, object],
    *,
    requested_by: str,
    source: RequestSource = RequestSource.API,
    note: str | None = None,
) -> ControlRequestRow:
    """Validate ``values`` and store them as a pending request of the running run ``run_id``;
    ``note`` (the autopilot's why) goes in the audit trail, and stays there when the
    request is rejected (why: its ``reason``).

    Raises :class:`RunNotFound`, :class:`RunNotRunning` or :class:`ControlValidationError`;
    nothing is written then.
    """
    with store.write() as conn:
        return file_request(
            conn, run_id, values, requested_by=requested_by, source=source, note=note
        )


def file_request(
    conn: Connection,
    run_id: int,
    values: Mapping[str, object],
    *,
    requested_by: str,
    source: RequestSource,
    note: str | None = None,
) -> ControlRequestRow:
    """:func:`request_control` on ``conn``, a connection of a write transaction: for a
    caller that files a request together with other writes of its own. The errors are
    raised before anything is written, so the transaction can go on without it."""
    if source not in CONTROL_SOURCES:
        known = ", ".join(CONTROL_SOURCES)
        raise ValueError(f"source must be one of {known}, not {source!r}")
    now = time.time()
    run = _run_row(conn, run_id)
    status = effective_status(run, now)
    if status is not RunStatus.RUNNING:
        raise RunNotRunning(run_id, status)
    clean = validate_control(values, run["control"])
    result = conn.execute(
        control_requests.insert().values(
            run_id=run_id,
            values=clean,
            source=source,
            requested_by=requested_by,
            requested_at=now,
            status=RequestStatus.PENDING,
            note=note,
        )
    )
    key = result.inserted_primary_key
    assert key is not None  # an INSERT of one row always has one
    return _request(conn, int(key[0]))


# Whether run ``?`` has a pending request: a statement a row exists for.
ANY_PENDING = (
    "SELECT 1 FROM control_requests"
    f" WHERE run_id = ? AND status = '{RequestStatus.PENDING}' LIMIT 1"
)


class PendingProbe:
    """Whether a run has pending requests, asked cheaply: one statement on a connection the
    probe holds (about 6 us of CPU, against about 300 us for :func:`pending_requests`).

    The reporting rank polls several times a second for the whole run, next to the
    training thread, and almost every poll finds nothing; only a hit needs the full read.
    """

    def __init__(self, store: Store) -> None:
        self._conn = store.engine.raw_connection()
        self._sql = driver_sql(ANY_PENDING, store.engine.dialect.name)

    def __call__(self, run_id: int) -> bool:
        cursor = self._conn.cursor()
        try:
            cursor.execute(self._sql, (run_id,))
            return cursor.fetchone() is not None
        finally:
            cursor.close()
            self._conn.rollback()  # hold no read snapshot between polls

    def close(self) -> None:
        self._conn.close()


def pending_requests(store: Store, run_id: int) -> list[ControlRequestRow]:
    """The run's pending requests, oldest first."""
    with store.read() as conn:
        return pending_in(conn, run_id)


def pending_in(conn: Connection, run_id: int) -> list[ControlRequestRow]:
    """:func:`pending_requests` read on ``conn``, beside what else it reads."""
    rows = conn.execute(
        select(control_requests)
        .where(
            control_requests.c.run_id == run_id,
            control_requests.c.status == RequestStatus.PENDING,
        )
        .order_by(control_requests.c.id)
    ).all()
    return [_to_row(row) for row in rows]


def mark_applied(
    store: Store,
    request_id: int,
    *,
    step: int,
    at: float,
    state: Mapping[str, Any],
    version: int,
) -> None:
    """Record that the request took effect at ``step``; ``state`` is now the run's control."""
    with store.write() as conn:
        run_id = _settle(
            conn, request_id, status=RequestStatus.APPLIED, applied_step=step, applied_at=at
        )
        conn.execute(
            update(runs)
            .where(runs.c.id == run_id)
            .values(control=dict(state), control_version=version)
        )


def mark_rejected(
    store: Store,
    request_id: int,
    *,
    reason: str,
    step: int | None = None,
    at: float | None = None,
) -> None:
    """Record that the request was refused, and why (its note stays); the run's control is
    unchanged."""
    with store.write() as conn:
        _settle(
            conn,
            request_id,
            status=RequestStatus.REJECTED,
            reason=reason,
            applied_step=step,
            applied_at=time.time() if at is None else at,
        )


def record_code_change(
    store: Store,
    run_id: int,
    values: Mapping[str, Any],
    *,
    step: int,
    at: float,
    state: Mapping[str, Any],
    version: int,
    requested_by: str = "code",
) -> ControlRequestRow:
    """Audit a change made by the training code itself (a public setter): applied at ``step``."""
    with store.write() as conn:
        _run_row(conn, run_id)
        result = conn.execute(
            control_requests.insert().values(
                run_id=run_id,
                values=dict(values),
                source=RequestSource.CODE,
                requested_by=requested_by,
                requested_at=at,
                status=RequestStatus.APPLIED,
                applied_step=step,
                applied_at=at,
            )
        )
        conn.execute(
            update(runs)
            .where(runs.c.id == run_id)
            .values(control=dict(state), control_version=version)
        )
        key = result.inserted_primary_key
        assert key is not None  # an INSERT of one row always has one
        return _request(conn, int(key[0]))


def control_history(store: Store, run_id: int) -> list[ControlRequestRow]:
    """Every request of the run, oldest first.

    A run that crashed (its heartbeat stopped) applies nothing more: its pending requests
    read as rejected, as they are once a trainer resumes the run.
    """
    with store.read() as conn:
        run = _run_row(conn, run_id)
        rows = conn.execute(
            select(control_requests)
            .where(control_requests.c.run_id == run_id)
            .order_by(control_requests.c.id)
        ).all()
    return _as_shown(run, [_to_row(row) for row in rows])


@dataclass(frozen=True)
class HistoryPage:
    """A page of a run's audit trail, oldest first; ``older`` is the ``before`` of the
    page before it (None: this page holds the run's first request)."""

    rows: list[ControlRequestRow]
    older: int | None


def control_history_page(
    store: Store, run_id: int, *, before: int | None = None, limit: int = 100
) -> HistoryPage:
    """The newest ``limit`` requests of the run with an id below ``before`` (default: the
    newest of all), oldest first: a keyset page, read from ``ix_control_requests_run_id``
    whatever the length of the history. Requests read as :func:`control_history` shows
    them.
    """
    if limit < 1:
        raise ValueError(f"limit must be >= 1, not {limit}")
    query = select(control_requests).where(control_requests.c.run_id == run_id)
    if before is not None:
        query = query.where(control_requests.c.id < before)
    query = query.order_by(control_requests.c.id.desc()).limit(limit + 1)
    with store.read() as conn:
        run = _run_row(conn, run_id)
        rows = conn.execute(query).all()
    page = _as_shown(run, [_to_row(row) for row in reversed(rows[:limit])])
    return HistoryPage(page, page[0].id if len(rows) > limit else None)


def _as_shown(run: RowMapping, history: list[ControlRequestRow]) -> list[ControlRequestRow]:
    if effective_status(run) is not RunStatus.CRASHED:
        return history
    reason = ended_first(RunStatus.CRASHED)
    return [
        replace(row, status=RequestStatus.REJECTED, reason=reason)
        if row.status is RequestStatus.PENDING
        else row
        for row in history
    ]


def control_request(store: Store, request_id: int) -> ControlRequestRow:
    """The request ``request_id`` as :func:`control_history` shows it (one still pending in a
    run that crashed reads as rejected); :class:`RequestNotFound` if there is none."""
    with store.read() as conn:
        row = conn.execute(
            select(control_requests).where(control_requests.c.id == request_id)
        ).first()
        if row is None:
            raise RequestNotFound(request_id)
        request = _to_row(row)
        run = _run_row(conn, request.run_id)
    return _as_shown(run, [request])[0]


def control_state(store: Store, run_id: int) -> dict[str, Any]:
    """The control values in effect plus their ``version`` (0 before any change)."""
    with store.read() as conn:
        run = _run_row(conn, run_id)
    return {**run["control"], "version": run["control_version"]}


def _run_row(conn: Connection, run_id: int) -> RowMapping:
    row = conn.execute(
        select(runs.c.status, runs.c.heartbeat_at, runs.c.control, runs.c.control_version).where(
            runs.c.id == run_id
        )
    ).first()
    if row is None:
        raise RunNotFound(run_id)
    return row._mapping


def _settle(conn: Connection, request_id: int, **values: Any) -> int:
    """Move a pending request to its final status; return its run id."""
    row = conn.execute(
        select(control_requests.c.run_id, control_requests.c.status).where(
            control_requests.c.id == request_id
        )
    ).first()
    if row is None:
        raise RequestNotFound(request_id)
    if row.status != RequestStatus.PENDING:
        raise ValueError(f"control request {request_id} is {row.status} already")
    conn.execute(
        update(control_requests).where(control_requests.c.id == request_id).values(**values)
    )
    return int(row.run_id)


def _request(conn: Connection, request_id: int) -> ControlRequestRow:
    row = conn.execute(select(control_requests).where(control_requests.c.id == request_id)).one()
    return _to_row(row)


def _to_row(row: Row[Any]) -> ControlRequestRow:
    return ControlRequestRow(
        id=row.id,
        run_id=row.run_id,
        values=dict(row.values),
        source=RequestSource(row.source),
        requested_by=row.requested_by,
        requested_at=row.requested_at,
        status=RequestStatus(row.status),
        applied_step=row.applied_step,
        applied_at=row.applied_at,
        reason=row.reason,
        note=row.note,
    )
