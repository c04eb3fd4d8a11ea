"""Runtime control of a run's scaler: the values in effect, the audit trail, new requests."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, Request, status

from app.deps import StoreDep, TokenDep
from app.limits import MAX_BODY_BYTES
from app.models import ControlRequest, ControlRequestOut, ControlView, ErrorMessage
from app.routes.runs import NOT_FOUND, RunId, require_run
from scaler.store.control import control_history_page, request_control
from scaler.store.queries import INT64_MAX

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
    responses={
        400: {
            "model": ErrorMessage,
            "description": "the body cannot be decoded: not UTF-8, an integer of over 4300"
            " digits, nesting too deep (JSON with a syntax error is a 422 json_invalid)",
        },
        401: {"model": ErrorMessage, "description": "missing or wrong bearer token"},
        404: {"model": ErrorMessage, "description": "no such run"},
        409: {"model": ErrorMessage, "description": "the run is not running"},
        413: {"model": ErrorMessage, "description": f"a body over {MAX_BODY_BYTES} bytes"},
        429: {
            "model": ErrorMessage,
            "description": "too many wrong tokens from this client lately: refused, whatever"
            " the token, for the seconds in Retry-After",
            "headers": {"Retry-After": {"schema": {"type": "integer"}}},
        },
    },
)
def post_control(
    store: StoreDep, _token: TokenDep, run: RunId, body: ControlRequest, request: Request
) -> ControlRequestOut:
    """Request a change; the reporting rank applies it at the next step boundary."""
    client = request.client.host if request.client else "unknown"
    row = request_control(
        store, run, body.model_dump(exclude_unset=True), requested_by=f"api@{client}"
    )
    return request_out(row)
