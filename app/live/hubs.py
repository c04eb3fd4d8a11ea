"""One poller per live run, whatever the number of its streams: the hubs of an app.

A hub reads a run's new steps and control changes once and encodes each poll's steps
once, into chunks of bytes that every stream of the run sends as they are. The app's
:class:`Hubs` is made in its lifespan (one of its :class:`~scalewatch.app.services.Services`); a hub
starts with the first stream of its run and stops when the last one leaves.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import functools
import logging
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import anyio

from scalewatch.store import notify, queries
from scalewatch.store.control import control_history
from scalewatch.store.engine import Store
from scalewatch.store.errors import storage_failure
from scalewatch.store.runs import Appended
from scalewatch.store.states import RunStatus

from ..models import ControlRequestOut
from ..settings import Settings
from .sse import coalesced_event, plain_step_events, sse_event, step_events

__all__ = ["Chunk", "Ended", "Hub", "Hubs", "Pacing"]

T = TypeVar("T")

log = logging.getLogger("scalewatch.app.stream")

# Control requests change rarely; look at them every few polls of the steps.
CONTROL_EVERY = 5
STEP_PAGE = 1000
# Reads of the store by all the hubs of an app at once. New steps are announced in bursts
# (50 runs writing every 0.2 s), and a worker thread a hub, up to 40, then fought over the
# GIL with the chart requests: short reads in a few threads serve 250 a second.
HUB_READS = 4


@dataclass(frozen=True, kw_only=True)
class Pacing:
    """How often a hub reads the store and how much it keeps: the app's settings
    ``stream_*`` (:class:`~scalewatch.app.settings.Settings` says what each one is)."""

    poll_s: float  # between polls of the store
    listen_fallback_s: float  # between polls, where PostgreSQL tells of new steps
    buffered_steps: int  # step events kept for streams a little behind
    behind_page: int  # steps of an aligned page, for streams further behind
    behind_pages: int  # such pages kept, most recently used
    max_lag_s: float  # a live stream further behind skips to the newest steps

    @classmethod
    def of(cls, settings: Settings) -> Pacing:
        return cls(
            poll_s=settings.stream_poll_s,
            listen_fallback_s=settings.stream_listen_fallback_s,
            buffered_steps=settings.stream_buffered_steps,
            behind_page=settings.stream_behind_page,
            behind_pages=settings.stream_behind_pages,
            max_lag_s=settings.stream_max_lag_s,
        )


class Chunk:
    """The ``event: step`` events of some consecutive steps, encoded once, as one ``bytes``
    that every stream of the run writes as it is; or the ``event: coalesced`` of steps
    the hub skipped (:meth:`gap`). ``read_at``: when it was read (``time.monotonic()``,
    the event loop's clock).

    A hub keeps up to ``stream_buffered_steps`` of them (50k steps, 1250 chunks a run), and
    the garbage collector's full passes walk every object it tracks: the step numbers are a
    tuple of ints, which the collector stops tracking at its first pass, so a chunk is one
    such object, not two (a list is tracked for life; so is an ``array``)."""

    __slots__ = ("data", "read_at", "steps")

    def __init__(self, rows: Sequence[Sequence[Any]], events: str | None = None) -> None:
        self.steps = tuple(row[0] for row in rows)
        # JSON is ASCII here (ensure_ascii): one character, one byte.
        self.data = (step_events(rows) if events is None else events).encode("ascii")
        self.read_at = time.monotonic()

    @classmethod
    def gap(cls, after: int, to: int) -> Chunk:
        """The steps after ``after`` up to ``to``, left out: one marker event."""
        chunk = cls(())
        chunk.steps, chunk.data = (to,), coalesced_event(after, to)
        return chunk

    def since(self, step: int) -> Chunk | None:
        """The chunk of its steps after ``step`` (itself when that is all of them)."""
        if not self.steps or self.steps[0] > step:
            return self
        if self.steps[-1] <= step:
            return None
        part = Chunk(())
        part.steps = self.steps[bisect.bisect_right(self.steps, step) :]
        part.data, part.read_at = self.after(step), self.read_at
        return part

    def after(self, step: int) -> bytes:
        """The events of the steps after ``step``."""
        first = bisect.bisect_right(self.steps, step)
        if first == 0:
            return self.data
        if first == len(self.steps):
            return b""
        # A stream resuming inside the chunk: rare; find where its first event starts.
        start = self.data.index(b"id: %d\n" % self.steps[first])
        return self.data[start:]


def _control_marks(store: Store, run_id: int) -> dict[int, tuple[str, Any]]:
    return {row.id: (row.status, row.applied_step) for row in control_history(store, run_id)}


def _read_new(
    store: Store,
    run_id: int,
    after: int,
    *,
    status: str | None = None,
    newest: bool = False,
) -> tuple[str | None, list[Chunk]]:
    """The run's status (unless known: ``status``), then its steps after ``after``,
    encoded, a page a chunk (one trip to a thread, so the event loop only hands the
    chunks on). With ``newest``, more than a page of new steps is cut to the newest page,
    after a :meth:`Chunk.gap` for the others: a hub that fell behind catches up at the
    cost of a page, not of its whole backlog.

    The status is read first: steps written before the run ended are still sent.
    """
    if status is None:
        status = queries.run_status(store, run_id)
    chunks = []
    rows = queries.step_rows_after(store, run_id, after, limit=STEP_PAGE)
    if newest and len(rows) == STEP_PAGE:
        last = queries.last_step(store, run_id)
        if last is not None and last - STEP_PAGE > rows[-1][0]:
            chunks.append(Chunk.gap(after, last - STEP_PAGE))
            after = last - STEP_PAGE
            rows = queries.step_rows_after(store, run_id, after, limit=STEP_PAGE)
    while True:
        if rows:
            chunks.append(Chunk(rows))
            after = rows[-1][0]
        if len(rows) < STEP_PAGE:
            return status, chunks
        rows = queries.step_rows_after(store, run_id, after, limit=STEP_PAGE)


def _read_page(store: Store, run_id: int, after: int, until: int) -> Chunk | None:
    """The steps in ``(after, until]``, encoded in the thread that reads them."""
    rows = queries.step_rows_after(store, run_id, after, until=until, limit=until - after)
    return Chunk(rows) if rows else None


@dataclass(frozen=True, slots=True)
class Ended:
    """A run no longer running, as its hub last read it: ``status`` None when the run is
    gone from the store."""

    status: RunStatus | None


class Hub:
    """The poller of one run and what it has read: the chunks of its latest steps, and the
    control events so far."""

    def __init__(
        self,
        store: Store,
        run_id: int,
        after: int,
        pacing: Pacing,
        reads: anyio.CapacityLimiter | None = None,
    ) -> None:
        self.store, self.run_id, self.pacing = store, run_id, pacing
        self.reads = reads  # shared by the app's hubs (None: anyio's default threads)
        self.after = self.floor = after  # the chunks hold every step in (floor, after]
        self.chunks: list[Chunk] = []
        self.lasts: list[int] = []  # the last step of each chunk
        self.buffered = 0  # steps in the chunks
        self.pages: OrderedDict[tuple[int, int], asyncio.Future[Chunk | None]] = OrderedDict()
        self.control_log: list[bytes] = []
        self.ended: Ended | None = None  # set once the run is not running
        self.failed = False
        self.tick = asyncio.Event()
        # Set once the control requests as they stand are read (or the hub has failed):
        # every change after that reaches the streams.
        self.watching = asyncio.Event()
        self.streams = 0
        self.handed = 0  # chunks the ingest handed over since the control was last read
        self.task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self.task = asyncio.create_task(self._poll())

    async def _run(self, read: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """``read(*args, **kwargs)`` in a worker thread, among the hubs' few."""
        return await anyio.to_thread.run_sync(
            functools.partial(read, *args, **kwargs), limiter=self.reads
        )

    async def _poll(self) -> None:
        # The store announces new steps (PostgreSQL's NOTIFY, a SQLite file's poller): then
        # a poll is only the fallback.
        waiter = notify.subscribe(self.store, self.run_id)
        try:
            marks = await self._run(_control_marks, self.store, self.run_id)
            self.watching.set()
            polls, woken = 0, False
            began = None
            while True:
                # A poll that comes more than max_lag_s after the last one began (a busy
                # machine) reads only the newest page of what it finds.
                now = time.monotonic()
                late = began is not None and now - began > self.pacing.max_lag_s
                began = now
                # Woken by PostgreSQL, or new steps at the last poll: the run has just
                # written steps, so it was running then; whether it has ended since is read
                # at the first poll that finds none (or PostgreSQL's fallback poll), or
                # with the control requests.
                known = RunStatus.RUNNING if woken and (polls + 1) % CONTROL_EVERY else None
                status, chunks = await self._run(
                    _read_new, self.store, self.run_id, self.after, status=known, newest=late
                )
                for chunk in chunks:
                    # Steps the ingest handed over while the read ran are kept already.
                    new = chunk.since(self.after)
                    if new is not None:
                        self._keep(new)
                polls += 1
                # Chunks the ingest handed over count as polls: they are the reads saved.
                if (
                    polls % CONTROL_EVERY == 0
                    or self.handed >= CONTROL_EVERY
                    or status is not RunStatus.RUNNING
                ):
                    self.handed = 0
                    await self._read_control(marks)
                if status is not RunStatus.RUNNING:
                    self.ended = Ended(None if status is None else RunStatus(status))
                    return
                self.wake()
                if waiter is None:
                    woken = bool(chunks)
                    await asyncio.sleep(self.pacing.poll_s)
                else:
                    pacing = self.pacing
                    due = time.monotonic() + max(pacing.poll_s, pacing.listen_fallback_s)
                    woken = await waiter.wait(due - time.monotonic())
                    # Announced steps that the ingest has handed over already: no read, but
                    # the fallback poll (the run's end, its control) still comes when due.
                    while woken and waiter.announced is not None and waiter.announced <= self.after:
                        woken = await waiter.wait(due - time.monotonic())
        except Exception as error:
            self.failed = True
            reason = storage_failure(error)
            if reason is None:
                raise
            # Its streams end; their clients reconnect and are told (503).
            log.warning("scalewatch: run %d's streams end: the store cannot be used: %s",
                        self.run_id, reason)  # fmt: skip
        finally:
            notify.unsubscribe(self.store, waiter)
            self.watching.set()
            self.wake()

    async def _read_control(self, marks: dict[int, tuple[str, Any]]) -> None:
        history = await self._run(control_history, self.store, self.run_id)
        for row in history:
            mark = (row.status, row.applied_step)
            if marks.get(row.id) != mark:
                marks[row.id] = mark
                out = ControlRequestOut.model_validate(row, from_attributes=True).model_dump()
                self.control_log.append(sse_event("control", out).encode())

    def take(self, after: int, chunk: Chunk) -> None:
        """The steps of ``chunk``, just stored by the ingest after the run's last step
        ``after``: kept and sent when the hub holds every step up to ``after`` (else its
        next read finds them)."""
        if self.ended is None and not self.failed and self.after == after:
            self._keep(chunk)
            self.handed += 1
            self.wake()

    def _keep(self, chunk: Chunk) -> None:
        self.chunks.append(chunk)
        self.lasts.append(chunk.steps[-1])
        self.buffered += len(chunk.steps)
        self.after = chunk.steps[-1]
        while self.buffered - len(self.chunks[0].steps) >= self.pacing.buffered_steps:
            dropped = self.chunks.pop(0)
            del self.lasts[0]
            self.buffered -= len(dropped.steps)
            self.floor = dropped.steps[-1]

    async def behind(self, after: int) -> tuple[bytes, int]:
        """For a stream behind ``floor``: the step events after ``after`` to the end of its
        aligned page (at most ``floor``), and the new cursor.

        Streams that fell behind together (a slow network, a busy machine) ask for the same
        pages: each is read and encoded once, so falling behind never multiplies the work
        by the number of streams.
        """
        size = self.pacing.behind_page
        first = after // size * size
        last = min(first + size, self.floor)
        key = (first, last)
        page = self.pages.get(key)
        if page is None:
            page = asyncio.ensure_future(
                self._run(_read_page, self.store, self.run_id, first, last)
            )
            # Retrieved here, so a failed read nobody waits for any more is not logged.
            page.add_done_callback(lambda done: done.cancelled() or done.exception())
            self.pages[key] = page
            while len(self.pages) > self.pacing.behind_pages:
                self.pages.popitem(last=False)
        else:
            self.pages.move_to_end(key)
        try:
            chunk = await asyncio.shield(page)  # a stream that leaves never cancels the read
        except Exception:
            if self.pages.get(key) is page:
                del self.pages[key]
            raise
        return (chunk.after(after) if chunk is not None else b""), last

    def wake(self) -> None:
        """Wake every stream of the run (new steps, its end, the server stopping)."""
        self.tick.set()
        self.tick = asyncio.Event()

    def since(self, after: int, *, live: bool = False) -> tuple[int, list[bytes]]:
        """The buffered step events after ``after`` (at least ``floor``), and the new cursor.

        A ``live`` stream (one that has caught up before) whose next events were read
        more than ``max_lag_s`` ago skips to the events read since (at least the newest
        chunk), after one ``event: coalesced`` that names the steps it left out.
        """
        first = bisect.bisect_right(self.lasts, after)
        chunks = self.chunks
        if first == len(chunks):
            return after, []
        if live:
            oldest = time.monotonic() - self.pacing.max_lag_s
            fresh = first
            while fresh < len(chunks) - 1 and chunks[fresh].read_at < oldest:
                fresh += 1
            if fresh > first:
                skipped = self.lasts[fresh - 1]
                return self.lasts[-1], [
                    coalesced_event(after, skipped),
                    *(chunk.data for chunk in chunks[fresh:]),
                ]
        return self.lasts[-1], [
            chunks[first].after(after),
            *(chunk.data for chunk in chunks[first + 1 :]),
        ]


class Hubs:
    """The hubs of the live runs of one app's store, by run. Made in the event loop."""

    def __init__(self, store: Store, pacing: Pacing) -> None:
        self.store, self.pacing = store, pacing
        self.reads = anyio.CapacityLimiter(HUB_READS)
        self._hubs: dict[int, Hub] = {}
        self._loop = asyncio.get_running_loop()
        # A SQLite store's watcher tells a hub the run's last step, and a hub that holds
        # it does not read. PostgreSQL's NOTIFY (the run's id, as every release sends it)
        # wakes a hub to read before the ingest can hand the steps over: there a hub reads.
        self._handing = store.engine.dialect.name == "sqlite"

    @property
    def appends(self) -> Callable[[int, Appended], None] | None:
        """What the ingest tells of the steps it stores after a run's last one:
        :meth:`offer` on SQLite; None on PostgreSQL, whose hubs read the steps its NOTIFY
        announces before the ingest could hand them over."""
        return self.offer if self._handing else None

    def offer(self, run_id: int, appended: Appended) -> None:
        """From the thread that has just stored ``appended`` (committed): the steps, encoded
        here, handed to the run's hub, which sends them without reading them back. Rows
        that are not plain (:func:`~.sse.plain_step_events`) are left to the hub's read."""
        hub = self._hubs.get(run_id)
        if hub is None or hub.after != appended.after:
            return
        events = plain_step_events(appended.rows)
        if events:
            chunk = Chunk(appended.rows, events)
            with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
                self._loop.call_soon_threadsafe(hub.take, appended.after, chunk)

    def __len__(self) -> int:
        return len(self._hubs)

    def join(self, run_id: int, after: int) -> Hub:
        """The run's hub, started by its first stream (from ``after``)."""
        hub = self._hubs.get(run_id)
        if hub is None:
            hub = self._hubs[run_id] = Hub(self.store, run_id, after, self.pacing, self.reads)
            hub.start()
        hub.streams += 1
        return hub

    def leave(self, hub: Hub) -> None:
        """A stream of ``hub`` has ended; the last one stops it."""
        hub.streams -= 1
        if hub.streams == 0:
            if self._hubs.get(hub.run_id) is hub:
                del self._hubs[hub.run_id]
            if hub.task is not None:
                hub.task.cancel()

    def wake(self) -> None:
        """Wake every stream of every run (an identity was revoked: each asks of its own)."""
        for hub in self._hubs.values():
            hub.wake()

    def close(self) -> None:
        """Stop every hub (the app is shutting down)."""
        for hub in self._hubs.values():
            if hub.task is not None:
                hub.task.cancel()
        self._hubs.clear()
