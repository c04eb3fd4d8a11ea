"""Where a job records through the service (``SCALEWATCH_DB=http://...``): its run, then
batches of its records; each answer carries the run's pending control requests."""

from __future__ import annotations

import functools

import anyio
from fastapi import APIRouter, status

from ..deps import ActorDep, ServicesDep, StoreDep
from ..ingest import BatchAnswer, BatchIn, RunOpen, RunOpened, open_job_run, store_batch
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


@router.post("/runs/{run}/batches", responses=_RESPONSES)
async def post_batch(
    services: ServicesDep, actor: ActorDep, run: RunId, body: BatchIn
) -> BatchAnswer:
    """Store a batch of the run's records in their order, once: a batch whose ``sequence``
    is stored already stores nothing. The answer carries the pending control requests."""
    batches = services.batches
    store = functools.partial(store_batch, services.store, batches, run, body, actor)
    return await anyio.to_thread.run_sync(store, limiter=batches.storing)
