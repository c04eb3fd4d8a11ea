"""Runs a job records through the service: who created each, and the last batch stored.

A writer's token records into the runs it created alone (``runs.owner``); each batch a job
sends carries its run's next sequence number, and the run keeps the last one stored
(``runs.batch_sequence``), so that a batch sent again after an answer was lost is known
and stores nothing twice. Any thread; each function is one transaction.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from sqlalchemy import Select, and_, select, update

from .control import ANY_PENDING, pending_requests
from .engine import Store
from .errors import RunNotFound
from .records import ControlRequestRow
from .schema import control_requests, runs, scale_loads, telemetry_gaps
from .states import RequestSource

__all__ = [
    "BatchState",
    "advance_sequence",
    "batch_state",
    "batch_state_and_pending",
    "batch_state_of_uid",
    "code_change_stored",
    "gap_stored",
    "load_stored",
]


class BatchState(NamedTuple):
    """A run as the ingest routes see it: its id, who created it, its last batch stored."""

    run_id: int
    owner: str | None  # None: written into the store directly, by no identity
    sequence: int


def batch_state(store: Store, run_id: int) -> BatchState:
    """Raises :class:`RunNotFound` for no such run."""
    with store.read() as conn:
        row = conn.execute(
            select(runs.c.id, runs.c.owner, runs.c.batch_sequence).where(runs.c.id == run_id)
        ).first()
    if row is None:
        raise RunNotFound(run_id)
    return BatchState(int(row.id), row.owner, int(row.batch_sequence))


# The run's state and whether it has pending requests, in one statement.
_STATE_AND_PENDING = f"SELECT owner, batch_sequence, EXISTS ({ANY_PENDING}) FROM runs WHERE id = ?"


def batch_state_and_pending(
    store: Store, run_id: int
) -> tuple[BatchState, list[ControlRequestRow]]:
    """:func:`batch_state` and the run's pending control requests (oldest first): what a
    batch's answer needs. One statement through the driver's cursor when none is pending
    (a job's every batch; SQLAlchemy's connection, transaction and statement took 25
    times as long), and the requests read after it when some are.
    Raises :class:`RunNotFound` for no such run."""
    rows = store.driver_rows(_STATE_AND_PENDING, (run_id, run_id))
    if not rows:
        raise RunNotFound(run_id)
    owner, sequence, any_pending = rows[0]
    pending = pending_requests(store, run_id) if any_pending else []
    return BatchState(run_id, owner, int(sequence)), pending


def batch_state_of_uid(store: Store, uid: str) -> BatchState | None:
    with store.read() as conn:
        row = conn.execute(
            select(runs.c.id, runs.c.owner, runs.c.batch_sequence).where(runs.c.uid == uid)
        ).first()
    return None if row is None else BatchState(int(row.id), row.owner, int(row.batch_sequence))


def advance_sequence(store: Store, run_id: int, sequence: int) -> None:
    """The run's batches up to ``sequence`` are stored."""
    with store.write() as conn:
        conn.execute(
            update(runs)
            .where(runs.c.id == run_id, runs.c.batch_sequence < sequence)
            .values(batch_sequence=sequence)
        )


# A batch the service stopped in the middle of storing is sent again whole: its steps
# replace themselves, and these say which of its other records are stored already.


def gap_stored(store: Store, run_id: int, first: int, last: int, dropped: int) -> bool:
    return _exists(
        store,
        select(telemetry_gaps.c.id).where(
            telemetry_gaps.c.run_id == run_id,
            telemetry_gaps.c.first_step == first,
            telemetry_gaps.c.last_step == last,
            telemetry_gaps.c.dropped == dropped,
        ),
    )


def load_stored(store: Store, run_id: int, step: int, at: float) -> bool:
    return _exists(
        store,
        select(scale_loads.c.id).where(
            scale_loads.c.run_id == run_id, scale_loads.c.step == step, scale_loads.c.at == at
        ),
    )


def code_change_stored(store: Store, run_id: int, step: int, at: float) -> bool:
    """Whether the training code's change of ``run_id`` at ``step`` (made at ``at``) is."""
    return _exists(
        store,
        select(control_requests.c.id).where(
            and_(
                control_requests.c.run_id == run_id,
                control_requests.c.source == RequestSource.CODE,
                control_requests.c.applied_step == step,
                control_requests.c.requested_at == at,
            )
        ),
    )


def _exists(store: Store, query: Select[Any]) -> bool:
    with store.read() as conn:
        return conn.execute(query).first() is not None
