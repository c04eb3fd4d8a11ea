"""Runtime control of a run's scaler: the values in effect, the audit trail, new requests."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, status

from scalewatch.store.control import control_history_page, request_control
from scalewatch.store.queries import INT64_MAX

from ..deps import ActorDep, StoreDep
from ..models import ControlRequest, ControlRequestOut, ControlView
from .runs import NOT_FOUND, RunId, require_run
from .write_responses import WRITE_RESPONSES

router = APIRouter(prefix="/api/runs", tags=["control"])


def request_out(row: object) -> ControlRequestOut:
    return ControlRequestOut.model_validate(row, from_attributes=True)


@router.get("/{run}/control", responses=NOT_FOUND)
def get_control(
    store: StoreDep,
    run: RunId,
    before: Annotated[int | None, Query(ge=1, le=INT64_MAX)] = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
) -> ControlView:
    """The values in effect and a page of the audit trail: the newest ``limit`` requests
    before the request ``before`` (default: all), oldest first."""
    info = require_run(store, run)
    state = {**info.control, "scale": info.scale, "version": info.control_version}
    page = control_history_page(store, run, before=before, limit=limit)
    return ControlView(
        state=state, history=[request_out(row) for row in page.rows], next=page.older
    )


@router.post(
    "/{run}/control",
    status_code=status.HTTP_202_ACCEPTED,
    responses=WRITE_RESPONSES,
)
def post_control(
    store: StoreDep, actor: ActorDep, run: RunId, body: ControlRequest
) -> ControlRequestOut:
    """Request a change; the reporting rank applies it at the next step boundary. The audit
    trail names the identity that asked."""
    row = request_control(store, run, body.model_dump(exclude_unset=True), requested_by=actor.name)
    return request_out(row)
