"""Live steps and control changes of a run as server-sent events."""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from typing import Annotated, Any

import anyio
from fastapi import APIRouter, Header, HTTPException, Request, status
from fastapi.responses import StreamingResponse
from starlette.concurrency import run_in_threadpool

from app.deps import SettingsDep, StoreDep
from app.routes.control import request_out
from app.routes.runs import INT64_MAX, NOT_FOUND, After, RunId
from scaler.store import queries
from scaler.store.control import control_history
from scaler.store.engine import Store

router = APIRouter(prefix="/api/runs", tags=["stream"])

# Control requests change rarely; look at them every few polls of the steps.
CONTROL_EVERY = 5


def sse_event(event: str, data: Any, event_id: int | None = None) -> str:
    """One event: ``sse_event("end", {"status": "finished"})`` is
    ``'event: end\\ndata: {"status": "finished"}\\n\\n'``."""
    head = f"id: {event_id}\n" if event_id is not None else ""
    return f"{head}event: {event}\ndata: {json.dumps(data, separators=(',', ':'))}\n\n"


def _control_marks(store: Store, run_id: int) -> dict[int, tuple[str, Any]]:
    return {row.id: (row.status, row.applied_step) for row in control_history(store, run_id)}


class _Tail:
    """What a stream has sent so far: the last step and the state of each control request."""

    def __init__(self, store: Store, run_id: int, after: int) -> None:
        self.store, self.run_id, self.after = store, run_id, after
        self.control = _control_marks(store, run_id)

    def poll_steps(self) -> list[str]:
        rows = queries.steps_after(self.store, self.run_id, self.after)
        if rows:
            self.after = rows[-1]["step"]
        return [sse_event("step", row, row["step"]) for row in rows]

    def poll_control(self) -> list[str]:
        events = []
        for row in control_history(self.store, self.run_id):
            mark = (row.status, row.applied_step)
            if self.control.get(row.id) != mark:
                self.control[row.id] = mark
                events.append(sse_event("control", request_out(row).model_dump()))
        return events


async def _events(
    request: Request, tail: _Tail, poll_s: float, keepalive_s: float
) -> AsyncIterator[str]:
    yield f"retry: 1000\n: streaming run {tail.run_id} after step {tail.after}\n\n"
    quiet_since, polls = time.monotonic(), 0
    while not await request.is_disconnected():
        # Read the status first: steps written before the run ended are still sent.
        run_status = await run_in_threadpool(queries.run_status, tail.store, tail.run_id)
        events = await run_in_threadpool(tail.poll_steps)
        polls += 1
        if polls % CONTROL_EVERY == 0 or run_status != "running":
            events += await run_in_threadpool(tail.poll_control)
        if run_status != "running":
            events.append(sse_event("end", {"status": run_status}))
        if events:
            yield "".join(events)
            quiet_since = time.monotonic()
        if run_status != "running":
            return
        if len(events) < 1000:
            if time.monotonic() - quiet_since >= keepalive_s:
                yield ": keep-alive\n\n"
                quiet_since = time.monotonic()
            await anyio.sleep(poll_s)


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
    last_event_id: Annotated[str | None, Header()] = None,
) -> StreamingResponse:
    """``event: step`` per new step (id = step), ``event: control`` per change of a control
    request, ``event: end`` once the run is no longer running. Starts after the
    ``Last-Event-ID`` header, else after ``?after=``, else after the run's last step."""
    resume = after
    if last_event_id:
        try:
            resume = int(last_event_id)
            if not -1 <= resume <= INT64_MAX:
                raise ValueError(resume)
        except ValueError:
            raise HTTPException(
                status.HTTP_422_UNPROCESSABLE_CONTENT,
                detail=[
                    {
                        "loc": ["header", "last-event-id"],
                        "msg": "must be a step number",
                        "type": "int_parsing",
                    }
                ],
            ) from None
    if await run_in_threadpool(queries.run_status, store, run) is None:
        raise HTTPException(status.HTTP_404_NOT_FOUND, detail=f"no run {run}")
    if resume is None:
        resume = await run_in_threadpool(queries.last_step, store, run)
    tail = await run_in_threadpool(_Tail, store, run, -1 if resume is None else resume)
    return StreamingResponse(
        _events(request, tail, settings.stream_poll_s, settings.stream_keepalive_s),
        media_type="text/event-stream",
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
    )
