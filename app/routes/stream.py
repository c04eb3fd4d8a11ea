"""Live steps and control changes of a run as server-sent events."""

from __future__ import annotations

import asyncio
import bisect
import json
import logging
import re
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Sequence
from itertools import chain
from math import isfinite
from typing import Annotated, Any

import anyio
from fastapi import APIRouter, Header, Request
from fastapi.responses import StreamingResponse
from starlette.concurrency import run_in_threadpool

from app.deps import SettingsDep, StoreDep
from app.routes.control import request_out
from app.routes.runs import NOT_FOUND, After, RunId, require_run_exists
from scaler.store import notify, queries
from scaler.store.control import control_history
from scaler.store.engine import Store, storage_failure
from scaler.store.states import RunStatus

log = logging.getLogger("app.stream")

router = APIRouter(prefix="/api/runs", tags=["stream"])

# Seconds between polls of a stream that PostgreSQL tells of new steps: for the run's
# end and control changes, which are not announced.
LISTEN_FALLBACK_S = 1.0
# Control requests change rarely; look at them every few polls of the steps.
CONTROL_EVERY = 5
STEP_PAGE = 1000
# Steps older than what a hub keeps are read in aligned pages of this many steps, each read
# and encoded once for all the streams that are that far behind.
BEHIND_PAGE = 5000
# Such pages a hub keeps, most recently used.
BEHIND_PAGES = 8
# Step events a hub keeps for streams that are a little behind (a slow client, a resume).
BUFFERED_STEPS = 50_000

_JSON = json.JSONEncoder(separators=(",", ":"))


def sse_event(event: str, data: Any, event_id: int | None = None) -> str:
    """One event: ``sse_event("end", {"status": "finished"})`` is
    ``'event: end\\ndata: {"status": "finished"}\\n\\n'``."""
    head = f"id: {event_id}\n" if event_id is not None else ""
    return f"{head}event: {event}\ndata: {_JSON.encode(data)}\n\n"


_STEP_EVENT = (
    "id: %d\nevent: step\ndata: "
    '{"step":%d,"wall_time":%r,"scale":%r,"overflow":%s,"skipped":%s,"inf_ranks":[%s],'
    '"scale_after":%r,"growth_tracker":%d,"growth_interval":%d,"growth_factor":%r,'
    '"backoff_factor":%r,"control_version":%d,"loss":%s,"loss_nonfinite_ranks":[%s],'
    '"params_omitted":%d}\n\n'
)
_COLUMN = {name: i for i, name in enumerate(queries.EXPORT_COLUMNS)}
_INTS = tuple(
    _COLUMN[name]
    for name in ("step", "growth_tracker", "growth_interval", "control_version", "params_omitted")
)
_FLOATS = tuple(
    _COLUMN[name]
    for name in ("wall_time", "scale", "scale_after", "growth_factor", "backoff_factor")
)
_BOOLS = (_COLUMN["overflow"], _COLUMN["skipped"])
_RANKS = (_COLUMN["inf_ranks"], _COLUMN["loss_nonfinite_ranks"])
_LOSS = _COLUMN["loss"]
_JSON_BOOL = {False: "false", True: "true"}.__getitem__
_RANK = r"(?:0|[1-9][0-9]*)"
# Ranks strings of a page joined by ";": "1,3;;0" (what write_steps stores).
_RANK_LISTS = re.compile(rf"(?:{_RANK}(?:,{_RANK})*)?(?:;(?:{_RANK}(?:,{_RANK})*)?)*")


def step_events(rows: Sequence[Sequence[Any]]) -> str:
    """The ``event: step`` events of raw step rows (``EXPORT_COLUMNS`` order): for each,
    exactly ``sse_event("step", step_dict(row), step)``.

    A step row is ints, finite floats, 0/1 flags, ranks strings like ``"1,3"`` and a loss
    that is a finite float or None, so one ``%`` over the whole page writes what the JSON
    encoder would (``repr`` of a float is its JSON) several times faster; a page with
    anything else (a non-finite float, a value of another type, ranks not in canonical
    form) goes through the JSON encoder.
    """
    if not rows:
        return ""
    width = len(queries.EXPORT_COLUMNS)
    values = list(chain.from_iterable(rows))
    columns = {i: values[i::width] for i in (*_INTS, *_FLOATS, *_RANKS, _LOSS)}
    losses = [loss for loss in columns[_LOSS] if loss is not None]
    if (
        all(set(map(type, columns[i])) == {int} for i in _INTS)
        and all(set(map(type, columns[i])) == {float} for i in _FLOATS)
        and all(all(map(isfinite, columns[i])) for i in _FLOATS)
        and set(map(type, losses)) <= {float}
        and all(map(isfinite, losses))
        and all(set(map(type, columns[i])) == {str} for i in _RANKS)
        and all(_RANK_LISTS.fullmatch(";".join(columns[i])) is not None for i in _RANKS)
    ):
        out: list[Any] = [None] * (len(rows) * (width + 1))
        # Column 0 twice: the step is the event's id and the first field of its data.
        out[0 :: width + 1] = columns[0]
        for i in range(width):
            column = columns[i] if i in columns else values[i::width]
            if i in _BOOLS:
                column = list(map(_JSON_BOOL, map(bool, column)))
            elif i == _LOSS:
                column = ["null" if loss is None else repr(loss) for loss in column]
            out[i + 1 :: width + 1] = column
        return (_STEP_EVENT * len(rows)) % tuple(out)
    return "".join(sse_event("step", queries.step_dict(row), row[0]) for row in rows)


class _Chunk:
    """The ``event: step`` events of some consecutive steps, encoded once, as one ``bytes``
    that every stream of the run writes as it is."""

    __slots__ = ("data", "steps")

    def __init__(self, rows: Sequence[Sequence[Any]]) -> None:
        self.steps = [row[0] for row in rows]
        # JSON is ASCII here (ensure_ascii): one character, one byte.
        self.data = step_events(rows).encode("ascii")

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


def _read_new(store: Store, run_id: int, after: int) -> tuple[str | None, list[_Chunk]]:
    """The run's status, then its steps after ``after``, encoded, a page a chunk (one trip
    to a thread, so the event loop only hands the chunks on).

    The status is read first: steps written before the run ended are still sent.
    """
    status = queries.run_status(store, run_id)
    chunks = []
    while True:
        rows = queries.step_rows_after(store, run_id, after, limit=STEP_PAGE)
        if rows:
            chunks.append(_Chunk(rows))
            after = rows[-1][0]
        if len(rows) < STEP_PAGE:
            return status, chunks


def _read_page(store: Store, run_id: int, after: int, until: int) -> _Chunk | None:
    """The steps in ``(after, until]``, encoded in the thread that reads them."""
    rows = queries.step_rows_after(store, run_id, after, until=until, limit=until - after)
    return _Chunk(rows) if rows else None


class _Hub:
    """One poller per run, whatever the number of streams: it reads new steps and control
    changes once and encodes each poll's new steps once, into one chunk of bytes that every
    stream of the run sends as it is.

    Started by the first stream of a run, stopped when the last one leaves.
    """

    def __init__(self, store: Store, run_id: int, after: int, poll_s: float) -> None:
        self.store, self.run_id, self.poll_s = store, run_id, poll_s
        self.after = self.floor = after  # the chunks hold every step in (floor, after]
        self.chunks: list[_Chunk] = []
        self.lasts: list[int] = []  # the last step of each chunk
        self.buffered = 0  # steps in the chunks
        self.pages: OrderedDict[tuple[int, int], asyncio.Future[_Chunk | None]] = OrderedDict()
        self.control_log: list[bytes] = []
        self.ended: str | bool | None = False  # the run's status once not running
        self.failed = False
        self.tick = asyncio.Event()
        self.streams = 0
        self.task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self.task = asyncio.create_task(self._poll())

    async def _poll(self) -> None:
        # PostgreSQL announces new steps (LISTEN/NOTIFY); then a poll is only the fallback.
        waiter = notify.subscribe(self.store, self.run_id)
        try:
            marks = await run_in_threadpool(_control_marks, self.store, self.run_id)
            polls = 0
            while True:
                status, chunks = await run_in_threadpool(
                    _read_new, self.store, self.run_id, self.after
                )
                for chunk in chunks:
                    self._keep(chunk)
                polls += 1
                if polls % CONTROL_EVERY == 0 or status is not RunStatus.RUNNING:
                    history = await run_in_threadpool(control_history, self.store, self.run_id)
                    for row in history:
                        mark = (row.status, row.applied_step)
                        if marks.get(row.id) != mark:
                            marks[row.id] = mark
                            out = request_out(row).model_dump()
                            self.control_log.append(sse_event("control", out).encode())
                if status is not RunStatus.RUNNING:
                    self.ended = status
                    return
                self._wake()
                if waiter is None:
                    await asyncio.sleep(self.poll_s)
                else:
                    await waiter.wait(max(self.poll_s, LISTEN_FALLBACK_S))
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
            self._wake()

    def _keep(self, chunk: _Chunk) -> None:
        self.chunks.append(chunk)
        self.lasts.append(chunk.steps[-1])
        self.buffered += len(chunk.steps)
        self.after = chunk.steps[-1]
        while self.buffered - len(self.chunks[0].steps) >= BUFFERED_STEPS:
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
        first = after // BEHIND_PAGE * BEHIND_PAGE
        last = min(first + BEHIND_PAGE, self.floor)
        key = (first, last)
        page = self.pages.get(key)
        if page is None:
            page = asyncio.ensure_future(
                run_in_threadpool(_read_page, self.store, self.run_id, first, last)
            )
            # Retrieved here, so a failed read nobody waits for any more is not logged.
            page.add_done_callback(lambda done: done.cancelled() or done.exception())
            self.pages[key] = page
            while len(self.pages) > BEHIND_PAGES:
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

    def _wake(self) -> None:
        self.tick.set()
        self.tick = asyncio.Event()

    def since(self, after: int) -> tuple[int, list[bytes]]:
        """The buffered step events after ``after`` (at least ``floor``), and the new cursor."""
        first = bisect.bisect_right(self.lasts, after)
        if first == len(self.chunks):
            return after, []
        return self.lasts[-1], [
            self.chunks[first].after(after),
            *(chunk.data for chunk in self.chunks[first + 1 :]),
        ]


_HUBS: dict[tuple[Store, int], _Hub] = {}


def _join(store: Store, run_id: int, after: int, poll_s: float) -> _Hub:
    hub = _HUBS.get((store, run_id))
    if hub is None:
        hub = _HUBS[(store, run_id)] = _Hub(store, run_id, after, poll_s)
        hub.start()
    hub.streams += 1
    return hub


def _leave(hub: _Hub) -> None:
    hub.streams -= 1
    if hub.streams == 0:
        if _HUBS.get((hub.store, hub.run_id)) is hub:
            del _HUBS[(hub.store, hub.run_id)]
        if hub.task is not None:
            hub.task.cancel()


async def _events(
    request: Request, store: Store, run_id: int, after: int, poll_s: float, keepalive_s: float
) -> AsyncIterator[bytes]:
    yield f"retry: 1000\n: streaming run {run_id} after step {after}\n\n".encode()
    hub = _join(store, run_id, after, poll_s)
    seen_control = len(hub.control_log)
    quiet_since = time.monotonic()
    stopping = request.app.state.stopping  # the server is stopping: the client reconnects
    try:
        while not (stopping.is_set() or await request.is_disconnected()):
            tick = hub.tick
            sent = False
            if after < hub.floor:
                # Behind what the hub keeps (a resume from far back, a slow client).
                data, after = await hub.behind(after)
                if data:
                    yield data
                    sent = True
                if after < hub.floor:
                    quiet_since = time.monotonic()
                    continue
            # One write per chunk: the hub's bytes go out as they are, never copied here.
            after, chunks = hub.since(after)
            for chunk in chunks:
                yield chunk
            for event in hub.control_log[seen_control:]:
                yield event
            sent = sent or bool(chunks) or seen_control < len(hub.control_log)
            seen_control = len(hub.control_log)
            if hub.ended is not False:
                yield sse_event("end", {"status": hub.ended}).encode()
                return
            if hub.failed:
                return
            if sent:
                quiet_since = time.monotonic()
            elif time.monotonic() - quiet_since >= keepalive_s:
                yield b": keep-alive\n\n"
                quiet_since = time.monotonic()
            with anyio.move_on_after(min(keepalive_s, 1.0)):
                await tick.wait()
    finally:
        _leave(hub)


@router.get(
    "/{run}/stream",
    response_class=StreamingResponse,
    responses={200: {"content": {"text/event-stream": {}}}, **NOT_FOUND},
)
async def stream(
    request: Request,
    store: StoreDep,
    settings: SettingsDep,
    run: RunId,
    after: After = None,
    last_event_id: Annotated[int | None, Header(ge=-1, le=queries.INT64_MAX)] = None,
) -> StreamingResponse:
    """``event: step`` per new step (id = step), ``event: control`` per change of a control
    request, ``event: end`` once the run is no longer running. Starts after the
    ``Last-Event-ID`` header, else after ``?after=``, else after the run's last step (and
    never after it: a point past the last step starts there)."""
    resume = after if last_event_id is None else last_event_id
    await run_in_threadpool(require_run_exists, store, run)
    last = await run_in_threadpool(queries.last_step, store, run)
    newest = -1 if last is None else last
    # Never past the last step: the run's one poller may start from this stream's point.
    start = newest if resume is None else min(resume, newest)
    return StreamingResponse(
        _events(request, store, run, start, settings.stream_poll_s, settings.stream_keepalive_s),
        media_type="text/event-stream",
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
    )
