"""Where a job records through the service (``SCALEWATCH_DB=http://...``): its run, then
batches of its records; each answer carries the run's pending control requests."""

from __future__ import annotations

import functools

import anyio
from fastapi import APIRouter, Request, status
from fastapi.exceptions import RequestValidationError

from scalewatch.store.engine import Store

from ..deps import ActorDep, ServicesDep, StoreDep
from ..errors import body_not_json
from ..ingest import (
    BATCH_BODY,
    BatchAnswer,
    RunBatches,
    RunOpen,
    RunOpened,
    open_job_run,
    parse_batch,
    store_batch,
)
from ..middleware.identity import Identity
from ..models import ErrorMessage
from .runs import RunId
from .write_responses import WRITE_RESPONSES

router = APIRouter(prefix="/api/ingest", tags=["ingest"])

_RESPONSES: dict[int | str, dict[str, object]] = {
    **WRITE_RESPONSES,
    403: {"model": ErrorMessage, "description": "a writer's token, for a run it did not create"},
}


@router.post("/runs", status_code=status.HTTP_200_OK, responses=_RESPONSES)
def open_run(store: StoreDep, actor: ActorDep, body: RunOpen) -> RunOpened:
    """Open the job's run ``uid``: made, owned by the token's identity, or continued."""
    return open_job_run(store, body, actor)


# A batch is decoded with its validation: what cannot be decoded is a 422 json_invalid too.
_BATCH_RESPONSES = {code: answer for code, answer in _RESPONSES.items() if code != 400}


@router.post("/runs/{run}/batches", responses=_BATCH_RESPONSES, openapi_extra=BATCH_BODY)
async def post_batch(
    services: ServicesDep, actor: ActorDep, run: RunId, request: Request
) -> BatchAnswer:
    """Store a batch of the run's records (a ``BatchIn``) in their order, once: a batch
    whose ``sequence`` is stored already stores nothing. The answer carries the pending
    control requests."""
    if body_not_json(request):
        raise RequestValidationError([])  # answered as any body that says it is not JSON
    raw = await request.body()
    batches = services.batches
    store = functools.partial(_store, services.store, batches, run, raw, actor)
    return await anyio.to_thread.run_sync(store, limiter=batches.storing)


def _store(store: Store, batches: RunBatches, run: int, raw: bytes, who: Identity) -> BatchAnswer:
    """The batch validated from its bytes and stored, off the event loop."""
    return store_batch(store, batches, run, parse_batch(raw), who)
