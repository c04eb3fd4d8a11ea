"""A job's run opened, and its batches stored in their order, each once.

One batch of a run at a time (a lock per run): a batch sent again while the first copy is
being stored waits, then finds its number stored and stores nothing. One the service
stopped in the middle of (killed) is stored again whole: its steps replace themselves,
and its gaps, loads and outcomes already stored are let be. A writer's token
reaches the runs it created alone; an admin's, any run.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence

import anyio
from fastapi import HTTPException, status
from pydantic import BaseModel

from scalewatch.store import control as store_control
from scalewatch.store import runs as store_runs
from scalewatch.store.batches import (
    BatchState,
    advance_sequence,
    batch_state_and_pending,
    batch_state_of_uid,
    code_change_stored,
    gap_stored,
    load_stored,
)
from scalewatch.store.engine import Store
from scalewatch.store.errors import RequestNotFound
from scalewatch.store.identities import Role
from scalewatch.store.records import ScaleLoad
from scalewatch.store.scale_loads import record_scale_load

from ..middleware.identity import Identity
from .models import (
    BatchAnswer,
    BatchIn,
    GapIn,
    LoadIn,
    OutcomeIn,
    PendingControl,
    RunOpen,
    RunOpened,
    StepRowsIn,
    StepsIn,
)

__all__ = ["STORING_THREADS", "RunBatches", "open_job_run", "store_batch"]

log = logging.getLogger("scalewatch.app")

# Batches stored at once, by the store's dialect. SQLite has one writer at a time: 40
# threads storing batches waited for its lock in its busy handler's sleeps (up to 100 ms
# each) while the holder waited for the GIL they fought over; PostgreSQL locks a run's
# row alone, and a few threads keep its round trips busy without that fight.
STORING_THREADS = {"sqlite": 1, "postgresql": 4}


# Told of a run's steps just stored after its last one, in the storing thread.
Appends = Callable[[int, store_runs.Appended], None]


class RunBatches:
    """The service's batches in progress: a lock per run, so that one batch of a run is
    stored at a time; the worker threads that store batches (``storing``, at most
    ``threads`` at once); and when a poll last set each run's heartbeat (monotonic).
    Each of ``told`` that is not None is told of each write of steps after a run's last
    one (the live streams' :attr:`~scalewatch.app.live.hubs.Hubs.appends`, the alert
    evaluator's :meth:`~scalewatch.app.alerts.evaluate.Evaluator.offer`). Made in the event
    loop (the app's lifespan)."""

    def __init__(self, threads: int, *told: Appends | None) -> None:
        self.told = tuple(tell for tell in told if tell is not None)
        self.storing = anyio.CapacityLimiter(threads)
        self._locks: dict[int, threading.Lock] = {}
        self._lock = threading.Lock()
        self.beats: dict[int, float] = {}

    def lock(self, run_id: int) -> threading.Lock:
        with self._lock:
            return self._locks.setdefault(run_id, threading.Lock())


def set_values(model: BaseModel) -> dict[str, object]:
    """The fields a body set, a null sent included; those left out are not there."""
    return model.model_dump(exclude_unset=True)


def check_owner(state: BatchState, who: Identity) -> None:
    """403 unless ``who`` may write the run: an admin, or the writer that created it."""
    if who.role is Role.ADMIN or (who.role is Role.WRITER and state.owner == who.name):
        return
    raise HTTPException(
        status.HTTP_403_FORBIDDEN,
        f"{who.name!r} has the role {who.role}: it records into the runs it created alone",
    )


def open_job_run(store: Store, body: RunOpen, who: Identity) -> RunOpened:
    """The run ``body.uid``: made (owned by ``who``), or continued when it exists: resumed,
    or the same run again when the answer to its making was lost."""
    found = batch_state_of_uid(store, body.uid)
    if found is not None:
        check_owner(found, who)
        if body.resume:
            store_runs.resume_run(store, body.uid, host=body.host, pid=body.pid)
        return RunOpened(id=found.run_id, uid=body.uid, sequence=found.sequence)
    try:
        ref = store_runs.create_run(
            store,
            name=body.name,
            world_size=body.world_size,
            config=body.config,
            control=set_values(body.control),
            uid=body.uid,
            torch_version=body.torch_version,
            started_at=body.started_at,
            owner=who.name,
            host=body.host,
            pid=body.pid,
        )
    except ValueError as refused:  # made meanwhile by another request
        raise HTTPException(status.HTTP_409_CONFLICT, str(refused)) from None
    return RunOpened(id=ref.id, uid=ref.uid, sequence=0)


def store_batch(
    store: Store, batches: RunBatches, run_id: int, body: BatchIn, who: Identity
) -> BatchAnswer:
    """Store ``body``'s items in their order, then its end, unless its number is stored
    already; answer with the run's pending control requests (read with the run's state,
    and again after a batch that settled some: an outcome, or the run's end)."""
    beats = batches.beats
    with batches.lock(run_id):
        state, pending = batch_state_and_pending(store, run_id)
        check_owner(state, who)
        fresh = body.sequence > state.sequence
        if fresh:
            # A batch that ends with steps advances its number in their transaction.
            last = body.items[-1] if body.items and body.end is None else None
            carried = isinstance(last, StepsIn | StepRowsIn)
            for item in body.items:
                sequence = body.sequence if carried and item is last else None
                _store_item(store, run_id, item, sequence=sequence, told=batches.told)
            if body.end is not None:
                store_runs.end_run(store, run_id, body.end)
            if not carried:
                advance_sequence(store, run_id, body.sequence)
            if any(isinstance(item, StepsIn | StepRowsIn) for item in body.items):  # steps: alive
                beats[run_id] = time.monotonic()
            if body.end is not None or any(isinstance(i, OutcomeIn) for i in body.items):
                pending = store_control.pending_requests(store, run_id)  # settled some
        elif time.monotonic() - beats.get(run_id, 0.0) >= store_runs.HEARTBEAT_INTERVAL_S:
            store_runs.heartbeat(store, run_id)  # a poll says the job is alive
            beats[run_id] = time.monotonic()
    return BatchAnswer(
        sequence=max(body.sequence, state.sequence),
        stored=fresh,
        control=[PendingControl(id=row.id, values=row.values) for row in pending],
    )


def _store_item(
    store: Store,
    run_id: int,
    item: StepsIn | StepRowsIn | GapIn | LoadIn | OutcomeIn,
    *,
    sequence: int | None = None,
    told: Sequence[Appends] = (),
) -> None:
    """``item`` stored; ``sequence``: a number the steps' transaction advances the run to;
    ``told``: told of steps stored after the run's last one."""
    if isinstance(item, StepsIn | StepRowsIn):
        # A step's fields are the columns, in their order (StepIn is derived from them;
        # pinned by a test): its values as they are, five times cheaper than by name.
        if isinstance(item, StepRowsIn):
            rows = item.rows
        else:
            rows = [tuple(vars(step).values()) for step in item.steps]
        numbers = {row[0] for row in rows}
        findings = [(f.step, f.rank, f.name, f.kind, f.count) for f in item.findings]
        if any(finding[0] not in numbers for finding in findings):
            log.warning("scalewatch: findings of steps not in their batch, of run %d", run_id)
            findings = [finding for finding in findings if finding[0] in numbers]
        added = store_runs.write_step_values(
            store, run_id, rows, findings, sequence=sequence, appended=bool(told)
        )
        if added is not None:
            for tell in told:
                tell(run_id, added)
    elif isinstance(item, GapIn):
        if item.last < item.first:
            log.warning("scalewatch: a gap that ends before it begins, of run %d", run_id)
        elif not gap_stored(store, run_id, item.first, item.last, item.dropped):
            store_runs.record_gap(store, run_id, item.first, item.last, item.dropped, item.reason)
    elif isinstance(item, LoadIn):
        load = ScaleLoad(
            step=item.step,
            at=item.at,
            scale_after=item.scale_after,
            scale_before=item.scale_before,
            from_step=item.from_step,
        )
        if not load_stored(store, run_id, item.step, item.at):
            record_scale_load(store, run_id, load)
    else:
        _store_outcome(store, run_id, item)


def _store_outcome(store: Store, run_id: int, item: OutcomeIn) -> None:
    """A control outcome of the run; one of a request of another run, or settled already
    (a batch stored half before the service stopped, sent again), is let go."""
    state = set_values(item.state)
    if item.step is None and (item.source == "code" or item.applied):
        log.warning("scalewatch: a change applied at no step, of run %d", run_id)
        return
    if item.source == "code":
        assert item.step is not None
        if code_change_stored(store, run_id, item.step, item.at):
            return
        store_control.record_code_change(
            store,
            run_id,
            set_values(item.values),
            step=item.step,
            at=item.at,
            state=state,
            version=item.version,
        )
        return
    if item.request_id is None:
        log.warning("scalewatch: a request's outcome without its id, of run %d", run_id)
        return
    try:
        if store_control.control_request(store, item.request_id).run_id != run_id:
            log.warning("scalewatch: an outcome of request %d of another run", item.request_id)
            return
        if item.applied:
            assert item.step is not None
            store_control.mark_applied(
                store,
                item.request_id,
                step=item.step,
                at=item.at,
                state=state,
                version=item.version,
            )
        else:
            store_control.mark_rejected(
                store,
                item.request_id,
                reason=item.reason or "refused",
                step=item.step,
                at=item.at,
            )
    except (RequestNotFound, ValueError):  # gone, or settled already
        return
