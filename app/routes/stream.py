"""Live steps and control changes of a run as server-sent events (sse-starlette's
``EventSourceResponse``: keep-alive pings, the client's disconnect, the server's shutdown)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Annotated

import anyio
from fastapi import APIRouter, Header, Request
from sse_starlette import EventSourceResponse, ServerSentEvent
from starlette.concurrency import run_in_threadpool

from scalewatch.store import queries

from ..deps import ServicesDep, SettingsDep, StoreDep
from ..live.hubs import Hub, Hubs
from ..live.sse import opening, sse_event
from ..middleware.access import current_identity
from .runs import NOT_FOUND, After, RunId, require_run_exists

__all__ = ["router"]

router = APIRouter(prefix="/api/runs", tags=["stream"])


# How long a stream has to end by itself once the server stops, before it is cancelled:
# under uvicorn's wait for open responses (serving.SHUTDOWN_GRACE_S).
STOP_GRACE_S = 1.0


async def _events(
    hubs: Hubs,
    run_id: int,
    after: int,
    stopping: anyio.Event,
    still: Callable[[], str | None] = lambda: None,
) -> AsyncIterator[bytes]:
    """The stream of one client: the hub's bytes as they are, never copied here. It ends
    when the run does, or when the server stops (``stopping``, set by sse-starlette): a
    whole response, which the client reconnects after. It ends too, with ``event:
    refused``, once ``still()`` says why its client may no longer read (a revocation wakes
    every stream to ask). Its first bytes come once the hub watches the run's control
    requests: every change made after a client has them reaches it."""
    hub = hubs.join(run_id, after)
    wake = asyncio.ensure_future(_wake_on(stopping, hub))
    try:
        await hub.watching.wait()
        yield opening(run_id, after)
        seen_control = len(hub.control_log)
        live = False  # caught up once: from then on, never more than max_lag_s behind
        while not stopping.is_set():
            tick = hub.tick
            if why := still():
                yield sse_event("refused", {"detail": why}).encode()
                return
            if after < hub.floor:  # behind what the hub keeps (a resume from far back)
                data, after = await hub.behind(after)
                if data:
                    yield data
                if after < hub.floor:
                    continue
            after, chunks = hub.since(after, live=live)
            for chunk in chunks:
                yield chunk
            live = True
            for event in hub.control_log[seen_control:]:
                yield event
            seen_control = len(hub.control_log)
            if hub.ended is not None:
                yield sse_event("end", {"status": hub.ended.status}).encode()
                return
            if hub.failed:
                return
            await tick.wait()
    finally:
        wake.cancel()
        hubs.leave(hub)


async def _wake_on(stopping: anyio.Event, hub: Hub) -> None:
    await stopping.wait()
    hub.wake()


def _keep_alive() -> ServerSentEvent:
    return ServerSentEvent(comment="keep-alive", sep="\n")


LastEventId = Annotated[int | None, Header(ge=queries.BEFORE_FIRST_STEP, le=queries.INT64_MAX)]


@router.get(
    "/{run}/stream",
    response_class=EventSourceResponse,
    responses={200: {"content": {"text/event-stream": {}}}, **NOT_FOUND},
)
async def stream(
    request: Request,
    services: ServicesDep,
    store: StoreDep,
    settings: SettingsDep,
    run: RunId,
    after: After = None,
    last_event_id: LastEventId = None,
) -> EventSourceResponse:
    """``event: step`` per new step (id = step), ``event: control`` per change of a control
    request, ``event: end`` once the run is no longer running. Starts after the
    ``Last-Event-ID`` header, else after ``?after=``, else after the run's last step (and
    never after it: a point past the last step starts there)."""
    resume = after if last_event_id is None else last_event_id
    await run_in_threadpool(require_run_exists, store, run)
    last = await run_in_threadpool(queries.last_step, store, run)
    newest = queries.BEFORE_FIRST_STEP if last is None else last
    # Never past the last step: the run's one poller may start from this stream's point.
    start = newest if resume is None else min(resume, newest)
    stopping = anyio.Event()
    identity = current_identity(request.scope)
    revocations = services.revocations
    return EventSourceResponse(
        _events(services.hubs, run, start, stopping, lambda: revocations.refusal(identity)),
        headers={"Cache-Control": "no-cache"},
        ping=settings.stream_keepalive_s,
        ping_message_factory=_keep_alive,
        sep="\n",
        shutdown_event=stopping,
        shutdown_grace_period=STOP_GRACE_S,
    )
