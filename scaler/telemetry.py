"""The reporting rank's link to the store: a writer thread and a control poller.

Training never waits for the store. Samples queue in memory; while the store is
slow, locked or unwritable they wait, and past ``MAX_PENDING`` records the oldest
are dropped and counted, then recorded as a gap once the store takes writes again.

The writer gathers records for ``COALESCE_S`` before it writes them (at once when
``BATCH`` are queued, or for ``flush()`` and ``close()``): every transaction has a
fixed cost, and the training thread pays part of it in GIL hand-offs.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import uuid
from collections import deque
from collections.abc import Mapping
from typing import Any

from sqlalchemy.exc import OperationalError

from . import _control
from ._control import ControlUpdate
from ._recorder import ControlOutcome, StepSample
from .store import control as store_control
from .store import runs as store_runs
from .store.engine import Store, open_store
from .store.records import ControlRequestRow
from .store.runs import step_values

log = logging.getLogger("scaler.telemetry")

MAX_PENDING = 200_000
BATCH = 5000
COALESCE_S = 0.2
POLL_INTERVAL_S = 0.2
RETRY_S = 0.5
CLOSE_FAILING_S = 5.0  # how long close() waits for records once the store is failing


# Runs that a Telemetry of this process writes: two writers would interleave one run's steps.
_LIVE_UIDS: set[str] = set()
_LIVE_LOCK = threading.Lock()


class Telemetry:
    """Writes one run's samples and control outcomes; feeds pending requests to ``inbox``.

    ``target`` is a store URL, an open :class:`Store` (left open at the end), or
    None for the default store (``$SCALEWATCH_DB`` or ``sqlite:///scalewatch.db``).
    """

    def __init__(
        self,
        target: str | Store | None,
        *,
        name: str | None,
        world_size: int,
        config: Mapping[str, Any],
        control: Mapping[str, Any],
        inbox: deque[ControlUpdate],
        uid: str | None = None,
    ) -> None:
        with _LIVE_LOCK:
            if uid is not None and uid in _LIVE_UIDS:
                # A copy of a scaler (deepcopy, pickle, its state_dict) beside the original.
                log.warning(
                    "scalewatch: run %s is being written by another scaler of this process;"
                    " this one starts a run of its own",
                    uid,
                )
                uid = None
            self.uid = uid or uuid.uuid4().hex
            _LIVE_UIDS.add(self.uid)
        self._resume = uid is not None
        self._target = target
        self._store: Store | None = target if isinstance(target, Store) else None
        self._owns_store = not isinstance(target, Store)
        self._name = name or f"{socket.gethostname()}-{os.getpid()}-{self.uid[:6]}"
        self._world_size = world_size
        self._config = dict(config)
        self._control = dict(control)
        self._inbox = inbox
        self.run_id: int | None = None
        # Records as step_values(): plain tuples, which the garbage collector stops tracking.
        self._records: deque[tuple[Any, ...]] = deque()
        self._outcomes: deque[tuple[int, float, ControlOutcome]] = deque()
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._hurry = threading.Event()  # write now, without gathering more records
        self._stop = threading.Event()
        self._idle = threading.Condition(self._lock)
        self._in_flight = 0
        self.dropped = 0
        self._gaps: list[tuple[int, int, int]] = []  # (first, last, count): whole ranges
        self._failing: str | None = None
        self._handed: set[int] = set()
        self._file_id: tuple[int, int] | None = None
        self._closed = False
        self._writer = threading.Thread(
            target=self._write_loop, name="scalewatch-writer", daemon=True
        )
        self._poller = threading.Thread(
            target=self._poll_loop, name="scalewatch-poller", daemon=True
        )
        self._writer.start()
        self._poller.start()

    # ------------------------------------------------------------- intake

    def submit(self, samples: list[StepSample]) -> None:
        """Called by the recorder thread; never blocks on the store."""
        with self._lock:
            for sample in samples:
                self._records.append(step_values(sample.record))
                for outcome in sample.controls:
                    self._outcomes.append((sample.record.step, sample.record.wall_time, outcome))
            # The batch being written counts: it may fail and come back.
            overflow = len(self._records) + self._in_flight - MAX_PENDING
            for _ in range(min(max(0, overflow), len(self._records))):
                self._drop(self._records.popleft()[0])
            full = len(self._records) >= BATCH
        if full:
            self._hurry.set()
        self._wake.set()

    def _drop(self, step: int) -> None:
        self.dropped += 1
        if self._gaps and self._gaps[-1][1] + 1 == step:
            first, _, count = self._gaps[-1]
            self._gaps[-1] = (first, step, count + 1)
        else:
            self._gaps.append((step, step, 1))

    @property
    def threads(self) -> tuple[threading.Thread, threading.Thread]:
        return self._writer, self._poller

    def flush(self, timeout: float = 30.0, *, failing_timeout: float | None = None) -> bool:
        """Wait until everything queued so far is in the store (or ``timeout``).

        ``failing_timeout``: wait at most that long once the store is failing, whether it
        was failing when the wait began or fails during it.
        """
        deadline = time.monotonic() + timeout
        with self._lock:
            while self._records or self._outcomes or self._gaps or self._in_flight:
                if failing_timeout is not None and self._failing is not None:
                    # A store that fails at the end rarely recovers: do not hold up the exit.
                    now = time.monotonic()
                    wait = min(failing_timeout, deadline - now)
                    deadline = now + wait
                    log.warning(
                        "scalewatch: the store is not taking writes; waiting up to %g s for %d"
                        " records",
                        wait,
                        len(self._records) + self._in_flight,
                    )
                    failing_timeout = None
                left = deadline - time.monotonic()
                if left <= 0 or not self._writer.is_alive():
                    return False
                self._hurry.set()
                self._wake.set()
                self._idle.wait(min(left, 0.05))
        return True

    def close(self, status: str = "finished", timeout: float = 30.0) -> None:
        """Flush, mark the run ``status`` and stop both threads. Safe to call twice."""
        if self._closed:
            return
        self._closed = True
        with _LIVE_LOCK:
            _LIVE_UIDS.discard(self.uid)
        flushed = self.flush(timeout, failing_timeout=min(timeout, CLOSE_FAILING_S))
        self._stop.set()
        self._hurry.set()
        self._wake.set()
        self._writer.join(timeout)
        self._poller.join(timeout)
        store = self._store
        if store is not None and self.run_id is not None:
            try:
                store_runs.end_run(store, self.run_id, status)
            except Exception as error:
                log.warning("scalewatch: could not mark run %s %s: %s", self.run_id, status, error)
        if not flushed:
            with self._lock:  # queued, and a batch the writer may still be stuck writing
                unwritten = len(self._records) + self._in_flight
                self.dropped += unwritten
            log.warning("scalewatch: %d telemetry records not written at close", unwritten)
        if store is not None and self._owns_store:
            store.close()

    # ------------------------------------------------------------- writer

    def _write_loop(self) -> None:
        last_beat = 0.0
        while True:
            if self._wake.wait(store_runs.HEARTBEAT_INTERVAL_S / 2):
                self._hurry.wait(COALESCE_S)  # let more records gather first
            self._wake.clear()
            self._hurry.clear()
            stopping = self._stop.is_set()
            try:
                if self._ensure_run():
                    if self._write_pending():  # a batch of steps sets the heartbeat too
                        last_beat = time.monotonic()
                    now = time.monotonic()
                    if now - last_beat >= store_runs.HEARTBEAT_INTERVAL_S:
                        assert self._store is not None and self.run_id is not None
                        store_runs.heartbeat(self._store, self.run_id)
                        last_beat = now
                    self._recovered()
            except Exception as error:  # the store is down: keep the records, try again
                self._failed(error)
                if not stopping:
                    self._stop.wait(RETRY_S)
            with self._lock:
                self._idle.notify_all()
            if stopping:
                return

    def _ensure_run(self) -> bool:
        if self.run_id is not None:
            self._check_file()
            return True
        if self._store is None:
            self._store = open_store(self._target if isinstance(self._target, str) else None)
        self._file_id = _file_id(self._store)
        ref = store_runs.resume_run(self._store, self.uid) if self._resume else None
        if ref is None:
            ref = store_runs.create_run(
                self._store,
                name=self._name,
                world_size=self._world_size,
                config=self._config,
                control=self._control,
                uid=self.uid,
            )
        self.run_id = ref.id
        return True

    def _check_file(self) -> None:
        """SQLite writes on into a deleted file: notice it and start over on a new one."""
        store = self._store
        if store is None or self._file_id is None or _file_id(store) == self._file_id:
            return
        self.run_id = None
        self._resume = True
        store.engine.dispose()  # its pooled connections hold the old file open
        if self._owns_store:
            self._store = None
        raise FileNotFoundError(f"the store's database file was removed or replaced: {store.url}")

    def _write_pending(self) -> bool:
        """Write what is queued; True if some steps were written."""
        store, run_id = self._store, self.run_id
        assert store is not None and run_id is not None
        wrote = False
        while True:
            # The batch leaves the queue while it is written, so records dropped meanwhile
            # are never ones that reach the store; it goes back to the front if the write fails.
            with self._lock:
                batch = [self._records.popleft() for _ in range(min(BATCH, len(self._records)))]
                outcomes = list(self._outcomes)
                self._in_flight = len(batch) + len(outcomes)
            if not batch and not outcomes and not self._gaps:
                return wrote
            gaps: list[tuple[int, int, int]] = []
            try:
                try:
                    gaps = self._write_gaps(store, run_id)
                    store_runs.write_step_values(store, run_id, batch)
                    self._check_file()  # committed into a file removed meanwhile: write again
                    wrote = wrote or bool(batch)
                except BaseException:
                    replaced = _file_id(store) != self._file_id  # the gaps went with the file
                    with self._lock:
                        self._records.extendleft(reversed(batch))
                        if replaced:
                            self._gaps[:0] = gaps
                    raise
                for step, at, outcome in outcomes:
                    try:
                        _write_outcome(store, run_id, step, at, outcome)
                    except OperationalError:
                        raise
                    except Exception as error:  # e.g. the request was settled meanwhile
                        log.warning("scalewatch: control outcome not recorded: %s", error)
                    with self._lock:
                        self._outcomes.popleft()
            finally:
                with self._lock:
                    self._in_flight = 0

    def _write_gaps(self, store: Store, run_id: int) -> list[tuple[int, int, int]]:
        """Record the gaps so far; returns them (a failed one and those after it stay queued)."""
        with self._lock:
            gaps, self._gaps = _joined(self._gaps), []
        for i, (first, last, count) in enumerate(gaps):
            try:
                store_runs.record_gap(
                    store, run_id, first, last, count, self._failing or "telemetry queue full"
                )
            except Exception:
                with self._lock:
                    self._gaps[:0] = gaps[i:]
                raise
        return gaps

    def _failed(self, error: Exception) -> None:
        if self._failing is None:
            log.warning(
                "scalewatch: the store is not taking writes (%s); records wait, then are dropped",
                error,
            )
        self._failing = f"{type(error).__name__}: {error}"

    def _recovered(self) -> None:
        if self._failing is not None:
            log.warning(
                "scalewatch: the store takes writes again; %d records dropped", self.dropped
            )
            self._failing = None

    # ------------------------------------------------------------- poller

    def _reject(self, request_id: int, values: Mapping[str, Any], reason: str) -> None:
        outcome = ControlOutcome(request_id, dict(values), False, reason, {}, 0)
        with self._lock:
            self._outcomes.append((-1, time.time(), outcome))
        self._wake.set()

    def _poll_loop(self) -> None:
        probe: store_control.PendingProbe | None = None
        probed: tuple[int, tuple[int, int] | None] | None = None  # the store and file it reads
        try:
            while not self._stop.wait(POLL_INTERVAL_S):
                store, run_id, file_id = self._store, self.run_id, self._file_id
                if store is None or run_id is None:
                    continue
                try:
                    if probe is None or probed != (id(store), file_id):
                        _close_quietly(probe)
                        probe = None
                        probe, probed = store_control.PendingProbe(store), (id(store), file_id)
                    if not probe(run_id):
                        continue
                    pending = store_control.pending_requests(store, run_id)
                except Exception:  # a locked or missing store: try at the next poll
                    _close_quietly(probe)
                    probe = None
                    continue
                self._take(pending)
        finally:
            _close_quietly(probe)

    def _take(self, pending: list[ControlRequestRow]) -> None:
        for request in pending:
            if request.id in self._handed:
                continue
            self._handed.add(request.id)
            problem = _control.check(request.values, {})
            if problem is None:
                self._inbox.append(ControlUpdate(request.id, request.values))
            else:  # written past the store's validation: settle it, never apply it
                self._reject(request.id, request.values, problem)


def _close_quietly(probe: store_control.PendingProbe | None) -> None:
    if probe is None:
        return
    try:
        probe.close()
    except Exception:  # its store is gone already
        log.debug("scalewatch: could not close the control probe", exc_info=True)


def _joined(gaps: list[tuple[int, int, int]]) -> list[tuple[int, int, int]]:
    """``gaps`` in step order, ranges that touch joined into one.

    A batch whose write failed goes back to the front of the queue; when it is dropped
    after records that came in while it was being written, its steps open a second range
    right before the first.
    """
    joined: list[tuple[int, int, int]] = []
    for first, last, count in sorted(gaps):
        if joined and joined[-1][1] + 1 == first:
            start, _, before = joined[-1]
            joined[-1] = (start, last, before + count)
        else:
            joined.append((first, last, count))
    return joined


def _write_outcome(
    store: Store, run_id: int, step: int, at: float, outcome: ControlOutcome
) -> None:
    if outcome.request_id == 0:
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
        store_control.mark_applied(
            store,
            outcome.request_id,
            step=step,
            at=at,
            state=outcome.state,
            version=outcome.version,
        )
    else:
        store_control.mark_rejected(
            store,
            outcome.request_id,
            reason=outcome.reason or "refused",
            step=step if step >= 0 else None,
            at=at,
        )


def _file_id(store: Store) -> tuple[int, int] | None:
    """(device, inode) of the store's database file; None for an in-memory store."""
    path = store.engine.url.database
    if not path or path == ":memory:" or path.startswith("file:"):
        return None
    try:
        stat = os.stat(path)
    except OSError:
        return (-1, -1)
    return stat.st_dev, stat.st_ino
