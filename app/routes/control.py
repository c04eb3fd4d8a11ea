"""Runtime control of a run's scaler: the values in effect, the audit trail, new requests."""

from __future__ import annotations

from fastapi import APIRouter, Request, status

from app.deps import StoreDep, TokenDep
from app.models import ControlRequest, ControlRequestOut, ControlView
from app.routes.runs import require_run
from scaler.store.control import control_history, request_control

router = APIRouter(prefix="/api/runs", tags=["control"])


def request_out(row: object) -> ControlRequestOut:
    return ControlRequestOut.model_validate(row, from_attributes=True)


@router.get("/{run}/control")
def get_control(store: StoreDep, run: int) -> ControlView:
    info = require_run(store, run)
    state = {**info.control, "scale": info.scale, "version": info.control_version}
    history = [request_out(row) for row in control_history(store, run)]
    return ControlView(state=state, history=history)


@router.post(
    "/{run}/control",
    status_code=status.HTTP_202_ACCEPTED,
    responses={
        401: {"description": "missing or wrong bearer token"},
        404: {"description": "no such run"},
        409: {"description": "the run is not running"},
    },
)
def post_control(
    store: StoreDep, _token: TokenDep, run: int, body: ControlRequest, request: Request
) -> ControlRequestOut:
    """Request a change; the reporting rank applies it at the next step boundary."""
    client = request.client.host if request.client else "unknown"
    row = request_control(
        store, run, body.model_dump(exclude_unset=True), requested_by=f"api@{client}"
    )
    return request_out(row)
