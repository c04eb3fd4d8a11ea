"""A scaler's state loaded into a run that has steps: its writes and reads.

The trainer's writer thread records a load (:func:`record_scale_load`) that its scaler
noted at ``load_state_dict`` or ``load_checkpoint``; the service lists a run's loads
(:func:`scale_loads`). A load is a jump when the scale it loads differs from the run's
last recorded one: what a resumed job that restores the wrong scaler state shows
(a fresh 65536 after training had settled at 1024, say).

>>> load = ScaleLoad(step=100, at=0.0, scale_after=65536.0, scale_before=1024.0, from_step=150)
>>> load.jump
True
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from sqlalchemy import Connection, Integer, cast, func, select

from .engine import Store
from .errors import RunNotFound
from .records import ScaleLoad
from .schema import runs, scale_loads, steps

__all__ = ["ScaleLoad", "ScaleLoadRow", "load_counts", "record_scale_load", "scale_loads_of"]


@dataclass(frozen=True, slots=True)
class ScaleLoadRow:
    """A ``scale_loads`` row."""

    id: int
    run_id: int
    step: int
    from_step: int
    scale_before: float
    scale_after: float
    jump: bool
    at: float


def _last_step(conn: Connection, run_id: int) -> tuple[int, float] | None:
    """(step, scale after it) of the run's last recorded step; None for a run without."""
    row = conn.execute(
        select(steps.c.step, steps.c.scale_after)
        .where(steps.c.run_id == run_id)
        .order_by(steps.c.step.desc())
        .limit(1)
    ).first()
    return None if row is None else (int(row.step), float(row.scale_after))


def record_scale_load(store: Store, run_id: int, load: ScaleLoad) -> ScaleLoadRow | None:
    """Store ``load`` in run ``run_id``; None, nothing stored, when the scale before it is
    not known and the run has no recorded step (a run that starts from a checkpoint: its
    first scale is the loaded one, no jump).

    Raises :class:`RunNotFound` for no such run.
    """
    with store.write() as conn:
        if conn.execute(select(runs.c.id).where(runs.c.id == run_id)).first() is None:
            raise RunNotFound(run_id)
        before, from_step = load.scale_before, load.from_step
        if before is None or from_step is None:
            last = _last_step(conn, run_id)
            if last is None:
                return None
            from_step = last[0] if from_step is None else from_step
            before = last[1] if before is None else before
        row = ScaleLoadRow(
            id=0,
            run_id=run_id,
            step=load.step,
            from_step=from_step,
            scale_before=before,
            scale_after=load.scale_after,
            jump=before != load.scale_after,
            at=load.at,
        )
        values = {name: getattr(row, name) for name in ScaleLoadRow.__slots__ if name != "id"}
        key = conn.execute(scale_loads.insert().values(**values)).inserted_primary_key
        assert key is not None
    return dataclasses.replace(row, id=int(key[0]))


def scale_loads_of(store: Store, run_id: int) -> list[ScaleLoadRow]:
    """Run ``run_id``'s loads, oldest first (none for a run without, or no such run)."""
    query = select(scale_loads).where(scale_loads.c.run_id == run_id).order_by(scale_loads.c.id)
    with store.read() as conn:
        return [
            ScaleLoadRow(
                id=int(row.id),
                run_id=int(row.run_id),
                step=int(row.step),
                from_step=int(row.from_step),
                scale_before=float(row.scale_before),
                scale_after=float(row.scale_after),
                jump=bool(row.jump),
                at=float(row.at),
            )
            for row in conn.execute(query)
        ]


def load_counts(store: Store, run_id: int) -> tuple[int, int]:
    """(loads, jumps among them) of run ``run_id``."""
    jumps = func.coalesce(func.sum(cast(scale_loads.c.jump, Integer)), 0)
    query = select(func.count(), jumps).where(scale_loads.c.run_id == run_id)
    with store.read() as conn:
        loads, jumped = conn.execute(query).one()
    return int(loads), int(jumped)
