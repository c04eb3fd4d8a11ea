"""Telemetry, on the reporting rank: a bounded queue, a writer thread, a control poller.

Runs on the reporting rank only (rank 0 of the scaler's group; a single process reports
too), made by its scaler at the first ``update()``. The recorder thread hands samples in
(``Telemetry.submit``); the writer thread (``_writer``), which owns the store, writes them;
the poller thread (``_control_poller``) hands pending control requests to the training thread
through the scaler's inbox. The training thread only flushes and closes.

Training never waits for the store. Samples queue in memory (``_queue``); while the store
is slow, locked or unwritable they wait, and past ``max_pending`` records the oldest are
dropped and counted, then recorded as a gap once the store takes writes again.
"""

from __future__ import annotations

import itertools
import logging
import os
import socket
import subprocess
import threading
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields, replace
from typing import Any

from .._control.inbox import ControlInbox
from .._step_sample import StepSample, record_of, row_values
from ..mirrors import Mirror
from ..mirrors._feed import MirrorFeed
from ..spool import Spool, is_service_url, spool_root
from ..spool import spool_bytes as spool_bound
from ..store import runs as store_runs
from ..store.engine import Store
from ..store.records import ScaleLoad
from ..store.sqlite import refuse_network_store
from ..store.states import RunStatus
from ..store.urls import pinned_url
from ._control_poller import ControlPoller, Handout
from ._queue import CommandQueue, RecordGap
from ._remote import RemoteTelemetry, open_remote
from ._sender import ServiceSender
from ._wire import OpenRun
from ._writer import RunSpec, Writer, one_line

__all__ = ["RemoteTelemetry", "Telemetry", "TelemetrySettings", "open_run"]

log = logging.getLogger("scalewatch.telemetry")
_UNSET = object()  # a field a pickle does not hold

# Runs that a Telemetry of this process writes: two writers would interleave one run's steps.
# Process-wide: the two are a scaler and its copy (deepcopy, pickle, state_dict), which share
# no object but the process; each Telemetry claims its uid here and lets it go at close().
_LIVE_UIDS: set[str] = set()
_LIVE_LOCK = threading.Lock()
WRITERS = ("process", "thread")
MAX_SENT_STEPS = 2000  # steps in one batch posted to the service: well under its body cap


@dataclass(frozen=True, slots=True)
class TelemetrySettings:
    """Where telemetry goes, and how it is queued and written; the defaults suit training.

    Passed as a scaler's ``telemetry=``:
    ``GradScaler(telemetry=TelemetrySettings("sqlite:///sw.db", max_pending=10_000))``.

    Args:
        store: a URL, an open :class:`Store` (left open at the end), or None for the
            default store (``$SCALEWATCH_DB`` or ``sqlite:///scalewatch.db``).
        max_pending: records kept in memory while the store is slow or failing; past
            it the oldest are dropped, counted and recorded as a gap.
        batch: the most records one transaction writes; a whole batch queued is
            written at once.
        coalesce_s: how long records gather before a write: fewer transactions, each
            of which costs the training thread GIL hand-offs.
        poll_interval_s: how often the store is asked for pending control requests.
        retry_s: the pause after a failed write before the next try.
        close_failing_s: how long ``close()`` waits for records once the store fails.
        heartbeat_s: how often an idle run tells the store it is alive (a run silent for
            ``scalewatch.store.runs.HEARTBEAT_TIMEOUT_S`` reads as crashed); a batch of steps
            counts as one.
        writer: ``"process"``: the store is written by a process of the training process's
            own (one for all its runs, started with the first), so that writing takes none
            of training's GIL; ``"thread"``: by a thread of the training process. A store
            passed open (a :class:`Store`) is always written by a thread.
        spool_dir: for a store URL ``http(s)://`` (the service): the node-local folder
            where batches wait while the service cannot be reached; None:
            ``$SCALEWATCH_SPOOL_DIR``, else ``scalewatch-spool-<uid>`` in the temporary folder.
        spool_bytes: the most bytes waiting there, all runs together; None:
            ``$SCALEWATCH_SPOOL_BYTES``, else 256 MiB. Past it, steps are dropped and counted.
        send_interval_s: for a store URL ``http(s)://``: how long records gather before
            they are posted, in place of ``coalesce_s``. The service's CPU a record falls
            with fewer, larger posts (each costs it a few ms whatever it carries); a step
            waits up to this long before it is sent, and a control request as long for
            the answer that carries it.
    """

    store: str | Store | None = None
    max_pending: int = 200_000
    batch: int = 5000
    coalesce_s: float = 0.2
    poll_interval_s: float = 0.2
    retry_s: float = 0.5
    close_failing_s: float = 5.0
    heartbeat_s: float = store_runs.HEARTBEAT_INTERVAL_S
    writer: str = "process"
    spool_dir: str | None = None
    spool_bytes: int | None = None
    send_interval_s: float = 0.5

    def __setstate__(self, state: list[Any]) -> None:
        """A pickle made before a field was added takes that field's default."""
        values = itertools.chain(state, itertools.repeat(_UNSET))
        for field, value in zip(fields(self), values, strict=False):
            object.__setattr__(self, field.name, field.default if value is _UNSET else value)

    def __post_init__(self) -> None:
        for name in ("max_pending", "batch"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
        for name in (
            "coalesce_s",
            "poll_interval_s",
            "retry_s",
            "close_failing_s",
            "send_interval_s",
        ):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float) or not value >= 0:
                raise ValueError(f"{name} must be a number of seconds >= 0, got {value!r}")
        bound = self.spool_bytes
        if bound is not None and (
            isinstance(bound, bool) or not isinstance(bound, int) or bound < 0
        ):
            raise ValueError(f"spool_bytes must be an integer >= 0, got {bound!r}")
        if self.writer not in WRITERS:
            raise ValueError(f"writer must be one of {', '.join(WRITERS)}, got {self.writer!r}")
        beat = self.heartbeat_s
        timeout = store_runs.HEARTBEAT_TIMEOUT_S
        if isinstance(beat, bool) or not isinstance(beat, int | float) or not 0 < beat < timeout:
            raise ValueError(f"heartbeat_s must be a number of seconds > 0 and < {timeout:g}")


def refuse_unusable_store(target: str | Store | TelemetrySettings | bool | None) -> None:
    """Raise now, where a scaler is made, for a telemetry target whose store cannot be
    kept where it is (a SQLite file on a network filesystem: ``StoreOnNetworkFilesystem``,
    a ValueError), rather than once training has begun and its writer opens it."""
    store = target.store if isinstance(target, TelemetrySettings) else target
    if store is False or isinstance(store, Store):
        return
    refuse_network_store(pinned_url(None if store is True else store))


def release_uid(uid: str) -> None:
    """``uid`` is written by no telemetry of this process any more (see :func:`_claim`)."""
    with _LIVE_LOCK:
        _LIVE_UIDS.discard(uid)


def default_name(uid: str) -> str:
    """A run's name when its script gives none: the host, the training process, the uid."""
    return f"{socket.gethostname()}-{os.getpid()}-{uid[:6]}"


def _claim(uid: str | None) -> tuple[str, bool]:
    """(the uid to write, whether it resumes ``uid``): a fresh one for None, or when a
    Telemetry of this process writes ``uid`` already."""
    with _LIVE_LOCK:
        if uid is not None and uid in _LIVE_UIDS:
            # A copy of a scaler (deepcopy, pickle, its state_dict) beside the original.
            log.warning(
                "scalewatch: run %s is being written by another scaler of this process;"
                " this one starts a run of its own",
                uid,
            )
            uid = None
        claimed = uid or uuid.uuid4().hex
        _LIVE_UIDS.add(claimed)
    return claimed, uid is not None


class Telemetry:
    """Writes one run's samples and control outcomes; feeds pending requests to ``inbox``.

    ``target`` is a store URL, an open :class:`Store` (left open at the end), None for
    the default store, or :class:`TelemetrySettings` that name the store and the rest.
    ``scale_load``: a load of the scaler's state made before this telemetry existed (a
    new process resuming run ``uid``), recorded against the run's last stored step.
    """

    def __init__(
        self,
        target: str | Store | TelemetrySettings | None,
        *,
        name: str | None,
        world_size: int,
        config: Mapping[str, Any],
        control: Mapping[str, Any],
        inbox: ControlInbox,
        uid: str | None = None,
        scale_load: ScaleLoad | None = None,
        fresh: bool = False,
        started_at: float | None = None,
        mirrors: Sequence[Mirror] = (),
    ) -> None:
        """``fresh``: ``uid`` is a new run's (claimed already by a training process whose
        writer process this is), not a run to resume; ``started_at``: when it began there;
        ``mirrors``: trackers the samples submitted are logged to as well (``_feed``)."""
        # A run starts at or before its first step: a scaler makes its telemetry before it
        # takes the first step's wall time, and the writer creates the run after it.
        started_at = time.time() if started_at is None else started_at
        settings = target if isinstance(target, TelemetrySettings) else TelemetrySettings(target)
        self.settings = settings
        self.uid, resume = _claim(uid)
        resume = resume and not fresh
        run = RunSpec(
            uid=self.uid,
            name=name or default_name(self.uid),
            world_size=world_size,
            config=dict(config),
            control=dict(control),
            started_at=started_at,
            resume=resume,
        )
        service = is_service_url(settings.store)
        batch = min(settings.batch, MAX_SENT_STEPS) if service else settings.batch
        self._queue = CommandQueue(settings.max_pending, batch)
        self._writer: Writer | ServiceSender
        self._control_poller: ControlPoller | None = None
        if service:  # the answers to its batches carry the control requests: no poller
            assert isinstance(settings.store, str)
            self._writer = ServiceSender(
                settings.store,
                run,
                self._queue,
                Handout(self._queue, inbox),
                coalesce_s=settings.send_interval_s,
                retry_s=settings.retry_s,
                poll_s=settings.poll_interval_s,
                spool=Spool(spool_root(settings.spool_dir), self.uid),
                spool_bytes=spool_bound(settings.spool_bytes),
            )
        else:
            self._writer = Writer(
                settings.store,
                run,
                self._queue,
                coalesce_s=settings.coalesce_s,
                retry_s=settings.retry_s,
                heartbeat_s=settings.heartbeat_s,
            )
            self._control_poller = ControlPoller(
                self._writer, self._queue, inbox, interval_s=settings.poll_interval_s
            )
        if scale_load is not None and resume:  # a run of its own has no steps before it
            self._queue.put_load(scale_load)
        self._closed = False
        self._mirrors = MirrorFeed(mirrors, self._run_ids) if mirrors else None
        for thread in self._writing_threads:
            thread.start()

    add_row = None  # the recorder thread hands samples over, even of cpu steps

    def _run_ids(self) -> tuple[str, int | None]:
        return self.uid, self._writer.run_id

    def submit(self, samples: list[StepSample]) -> None:
        """Called by the recorder thread; never blocks on the store, nor on a mirror."""
        self._queue.put(samples)
        if self._mirrors is not None:
            self._mirrors.put(samples)

    def submit_rows(self, rows: list[tuple[Any, ...]]) -> None:
        """Clean cpu steps' rows in ``TrainingRow``'s order (the writer process's); never
        blocks. Made straight into their ``steps`` rows where no mirror reads their records."""
        if self._mirrors is not None:
            self.submit([StepSample(record_of(row)) for row in rows])
            return
        self._queue.put_values([row_values(row) for row in rows])

    def note_gap(self, gap: RecordGap) -> None:
        """Steps dropped before they reached this telemetry; never blocks."""
        self._queue.put_gap(gap)

    def note_scale_load(self, load: ScaleLoad) -> None:
        """Called by the training thread at a load of the scaler's state; never blocks."""
        self._queue.put_load(load)

    @property
    def run_id(self) -> int | None:
        return self._writer.run_id

    @property
    def dropped(self) -> int:
        """Records lost so far: dropped past the queue's bound, or not written at close."""
        return self._queue.dropped

    @property
    def failing(self) -> str | None:
        """Why the store is not taking writes, in one line; None while it is."""
        return self._writer.failing

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def threads(self) -> tuple[threading.Thread, ...]:
        mirrors = () if self._mirrors is None else self._mirrors.threads
        return *self._writing_threads, *mirrors

    @property
    def _writing_threads(self) -> tuple[threading.Thread, ...]:
        """The writer's (or the sender's) and the control poller's, if any."""
        poller = self._control_poller
        return (self._writer.thread, *(() if poller is None else (poller.thread,)))

    def flush(self, timeout: float = 30.0, *, failing_timeout: float | None = None) -> bool:
        """Wait until everything queued so far is in the store (or ``timeout``).

        ``failing_timeout``: wait at most that long once the store is failing, whether it
        was failing when the wait began or fails during it.
        """
        queue, writer = self._queue, self._writer
        deadline = time.monotonic() + timeout
        while queue.pending():
            if failing_timeout is not None and writer.failing is not None:
                # A store that fails at the end rarely recovers: do not hold up the exit.
                now = time.monotonic()
                wait = min(failing_timeout, deadline - now)
                deadline = now + wait
                log.warning(
                    "scalewatch: the store is not taking writes; waiting up to %g s for %d records",
                    wait,
                    queue.unwritten(),
                )
                failing_timeout = None
            left = deadline - time.monotonic()
            if left <= 0 or not writer.thread.is_alive():
                return False
            queue.hurry(wait=min(left, 0.05))
        return True

    def close(self, status: RunStatus | None = RunStatus.FINISHED, timeout: float = 30.0) -> None:
        """Flush, mark the run ``status`` and stop both threads. Safe to call twice.

        ``status`` None: the run is left as it is, its heartbeat stopped (the writer
        process of a training process gone: the run reads crashed at the timeout)."""
        if self._closed:
            return
        self._closed = True
        release_uid(self.uid)
        queue, writer = self._queue, self._writer
        flushed = self.flush(timeout, failing_timeout=min(timeout, self.settings.close_failing_s))
        writer.stop.set()
        if self._control_poller is not None:
            self._control_poller.stop.set()
        queue.wake_writer()
        for thread in self._writing_threads:
            thread.join(timeout)
        writer.end(status)
        if not flushed:  # queued, and a batch the writer may still be stuck writing
            unwritten = queue.drop_unwritten()
            log.warning("scalewatch: %d telemetry records not written at close", unwritten)
        writer.close_store()
        if self._mirrors is not None:
            self._mirrors.close()


def open_run(
    target: str | Store | TelemetrySettings | None,
    *,
    name: str | None,
    world_size: int,
    config: Mapping[str, Any],
    control: Mapping[str, Any],
    inbox: ControlInbox,
    uid: str | None = None,
    scale_load: ScaleLoad | None = None,
    mirrors: Sequence[Mirror] = (),
) -> Telemetry | RemoteTelemetry:
    """A run's telemetry as its settings' ``writer`` says: written by this process's writer
    process, or by a thread (an open :class:`Store`, or a process that cannot start one).
    ``mirrors`` are written by threads of this process either way."""
    settings = target if isinstance(target, TelemetrySettings) else TelemetrySettings(target)
    if settings.writer == "process" and not isinstance(settings.store, Store):
        # the writer process may have started before $SCALEWATCH_DB or the folder changed
        settings = replace(settings, store=pinned_url(settings.store))
        started_at = time.time()
        claimed, resume = _claim(uid)
        run = OpenRun(
            settings=settings,
            name=name or default_name(claimed),
            world_size=world_size,
            config=dict(config),
            control=dict(control),
            uid=claimed,
            resume=resume,
            started_at=started_at,
        )
        try:
            remote = open_remote(run, inbox, mirrors)
        except (OSError, subprocess.SubprocessError) as error:
            release_uid(claimed)
            log.warning(
                "scalewatch: could not start the telemetry writer process (%s);"
                " a thread of this process writes the run",
                one_line(error),
            )
        else:
            if scale_load is not None and resume:  # a run of its own has no steps before it
                remote.note_scale_load(scale_load)
            return remote
    return Telemetry(
        settings,
        name=name,
        world_size=world_size,
        config=config,
        control=control,
        inbox=inbox,
        uid=uid,
        scale_load=scale_load,
        mirrors=mirrors,
    )
