"""The writer thread: owns the store, creates or resumes the run, carries out the commands
queued (``_queue``) in their order: steps, control outcomes, scale loads, gaps.

Runs on the reporting rank's writer thread.

It gathers records for ``coalesce_s`` before it writes them (at once when a whole
batch is queued, or for ``flush()`` and ``close()``): every transaction has a fixed
cost, and the training thread pays part of it in GIL hand-offs. A store that fails
keeps the records queued; the writer tries again every ``retry_s``.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, cast

from sqlalchemy.exc import OperationalError, StatementError

from .._control import ControlSource
from ..store import control as store_control
from ..store import runs as store_runs
from ..store import scale_loads as store_scale_loads
from ..store.engine import Store, open_store
from ..store.states import RunStatus
from ._queue import (
    Command,
    CommandQueue,
    RecordGap,
    RecordLoad,
    WriteOutcome,
    findings_of,
    norms_of,
)

log = logging.getLogger("scalewatch.telemetry")


@dataclass(frozen=True)
class RunSpec:
    """What the run row is created with; ``started_at`` is when recording began."""

    uid: str
    name: str
    world_size: int
    config: Mapping[str, Any]
    control: Mapping[str, Any]
    started_at: float
    resume: bool = False


class Writer:
    """Writes ``queue`` into the store named by ``target`` on a daemon thread."""

    def __init__(
        self,
        target: str | Store | None,
        run: RunSpec,
        queue: CommandQueue,
        *,
        coalesce_s: float,
        retry_s: float,
        heartbeat_s: float,
    ) -> None:
        self._target = target
        self.store: Store | None = target if isinstance(target, Store) else None
        self.owns_store = not isinstance(target, Store)
        self._run = run
        self._resume = run.resume
        self._queue = queue
        self._coalesce_s = coalesce_s
        self._retry_s = retry_s
        self._heartbeat_s = heartbeat_s
        self.run_id: int | None = None
        self.file_id: tuple[int, int] | None = None
        self.failing: str | None = None  # why the store is not taking writes, in one line
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._loop, name="scalewatch-writer", daemon=True)

    def _loop(self) -> None:
        queue = self._queue
        last_beat = 0.0
        while True:
            queue.wait_for_work(self._heartbeat_s / 2, self._coalesce_s)
            stopping = self.stop.is_set()
            try:
                if self._ensure_run():
                    if self._write_pending():  # a batch of steps sets the heartbeat too
                        last_beat = time.monotonic()
                    now = time.monotonic()
                    if now - last_beat >= self._heartbeat_s:
                        assert self.store is not None and self.run_id is not None
                        store_runs.heartbeat(self.store, self.run_id)
                        last_beat = now
                    self._recovered()
            except Exception as error:  # the store is down: keep the records, try again
                self._failed(error)
                if not stopping:
                    self.stop.wait(self._retry_s)
            queue.pass_done()
            if stopping:
                return

    def _ensure_run(self) -> bool:
        if self.run_id is not None:
            self._check_file()
            return True
        if self.store is None:
            self.store = open_store(self._target if isinstance(self._target, str) else None)
        self.file_id = file_id(self.store)
        run = self._run
        ref = store_runs.resume_run(self.store, run.uid) if self._resume else None
        if ref is None:
            first = self._queue.first_wall_time()
            ref = store_runs.create_run(
                self.store,
                name=run.name,
                world_size=run.world_size,
                config=run.config,
                control=run.control,
                uid=run.uid,
                started_at=run.started_at if first is None else min(run.started_at, first),
            )
        self.run_id = ref.id
        return True

    def _check_file(self) -> None:
        """SQLite writes on into a deleted file: notice it and start over on a new one."""
        store = self.store
        if store is None or self.file_id is None or file_id(store) == self.file_id:
            return
        self.run_id = None
        self._resume = True
        store.engine.dispose()  # its pooled connections hold the old file open
        if self.owns_store:
            self.store = None
        raise FileNotFoundError(f"the store's database file was removed or replaced: {store.url}")

    def _write_pending(self) -> bool:
        """Carry out what is queued, in its order; True if some steps were written."""
        store, run_id, queue = self.store, self.run_id, self._queue
        assert store is not None and run_id is not None
        wrote = False
        while commands := queue.take():
            try:
                wrote = self._carry_out(store, run_id, commands) or wrote
                self._check_file()  # committed into a file removed meanwhile: again
            except BaseException:
                queue.put_back(commands)
                raise
            finally:
                queue.written()
        return wrote

    def _carry_out(self, store: Store, run_id: int, commands: list[Command]) -> bool:
        """Carry out ``commands`` (as :meth:`CommandQueue.take` gives them); True for steps.

        A failure of the store raises, and they stay queued; a load or an outcome the store
        refuses for itself (its request settled meanwhile, say) is logged and let go.
        """
        head = commands[0]
        if isinstance(head, RecordGap):
            reason = self.failing or "telemetry queue full"
            for gap in commands:
                assert isinstance(gap, RecordGap)
                store_runs.record_gap(store, run_id, gap.first, gap.last, gap.dropped, reason)
            return False
        if isinstance(head, RecordLoad | WriteOutcome):
            try:
                if isinstance(head, RecordLoad):
                    store_scale_loads.record_scale_load(store, run_id, head.load)
                else:
                    write_outcome(store, run_id, head)
            except OperationalError:
                raise  # the store is down: it stays queued
            except Exception as error:
                what = "scale load" if isinstance(head, RecordLoad) else "control outcome"
                log.warning("scalewatch: %s not recorded: %s", what, one_line(error))
            return False
        steps = cast(list[tuple[Any, ...]], commands)  # take() gives steps alone, or none
        norms = norms_of(steps)  # a run that measures the gradient norm
        if norms:
            store_runs.write_step_values(store, run_id, steps, findings_of(steps), norms)
        else:
            store_runs.write_step_values(store, run_id, steps, findings_of(steps))
        return True

    def end(self, status: RunStatus | None) -> None:
        """Mark the run ``status`` (after the thread stopped; None: left as it is, its
        heartbeat stopped), and close the store if it is this writer's own."""
        store = self.store
        if store is not None and self.run_id is not None and status is not None:
            try:
                store_runs.end_run(store, self.run_id, status)
            except Exception as error:
                log.warning(
                    "scalewatch: could not mark run %s %s: %s", self.run_id, status, one_line(error)
                )

    def close_store(self) -> None:
        if self.store is not None and self.owns_store:
            self.store.close()

    def _failed(self, error: Exception) -> None:
        reason = one_line(error)
        if self.failing is None:
            log.warning(
                "scalewatch: the store is not taking writes (%s); records wait, then are dropped",
                reason,
            )
        self.failing = reason

    def _recovered(self) -> None:
        if self.failing is not None:
            log.warning(
                "scalewatch: the store takes writes again; %d records dropped", self._queue.dropped
            )
            self.failing = None


def one_line(error: BaseException) -> str:
    """Why ``error`` happened, in one line: the driver's own message, without SQL or values.

    >>> one_line(OSError("disk I/O error\\nmore"))
    'OSError: disk I/O error'
    """
    cause: BaseException = error
    if isinstance(error, StatementError) and error.orig is not None:
        cause = error.orig  # SQLAlchemy's message adds the statement and its parameters
    lines = str(cause).strip().splitlines()
    return f"{type(cause).__name__}: {lines[0] if lines else 'no message'}"


def write_outcome(store: Store, run_id: int, queued: WriteOutcome) -> None:
    outcome, step, at = queued.outcome, queued.step, queued.at
    if outcome.source is ControlSource.CODE:
        assert step is not None  # a setter's change is applied at the step it was made
        store_control.record_code_change(
            store,
            run_id,
            outcome.values,
            step=step,
            at=at,
            state=outcome.state,
            version=outcome.version,
        )
    elif outcome.applied:
        assert outcome.request_id is not None and step is not None
        store_control.mark_applied(
            store,
            outcome.request_id,
            step=step,
            at=at,
            state=outcome.state,
            version=outcome.version,
        )
    else:
        assert outcome.request_id is not None
        reason = outcome.reason or "refused"
        store_control.mark_rejected(store, outcome.request_id, reason=reason, step=step, at=at)


def file_id(store: Store) -> tuple[int, int] | None:
    """(device, inode) of the store's database file; None for an in-memory store."""
    path = store.engine.url.database
    if store.engine.dialect.name != "sqlite":
        return None  # a server's database: no file to be removed under the writer
    if not path or path == ":memory:" or path.startswith("file:"):
        return None
    try:
        stat = os.stat(path)
    except OSError:
        return (-1, -1)
    return stat.st_dev, stat.st_ino
