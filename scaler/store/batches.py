"""Runs a job records through the service: who created each, and the last batch stored.

A writer's token records into the runs it created alone (``runs.owner``); each batch a job
sends carries its run's next sequence number, and the run keeps the last one stored
(``runs.batch_sequence``), so that a batch sent again after an answer was lost is known
and stores nothing twice. Any thread; each function is one transaction.
"""

from __future__ import annotations

from typing import NamedTuple

from sqlalchemy import select, update

from .engine import Store
from .errors import RunNotFound
from .schema import runs

__all__ = ["BatchState", "advance_sequence", "batch_state", "batch_state_of_uid"]


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
