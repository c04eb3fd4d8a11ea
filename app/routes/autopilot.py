"""A run's autopilot: its state and last decision; turning it on (PUT) and off (DELETE)."""

from __future__ import annotations

from fastapi import APIRouter

from scalewatch.store.autopilot import AutopilotRow, disable_autopilot, get_autopilot, set_autopilot
from scalewatch.store.states import AutopilotState

from ..autopilot.models import AutopilotIn, AutopilotOut
from ..deps import ActorDep, StoreDep
from .runs import NOT_FOUND, RunId
from .write_responses import WRITE_RESPONSES

router = APIRouter(prefix="/api/runs", tags=["autopilot"])


def _out(run_id: int, row: AutopilotRow | None) -> AutopilotOut:
    if row is None:
        return AutopilotOut(run_id=run_id, enabled=False, state=AutopilotState.OFF)
    return AutopilotOut.model_validate(row, from_attributes=True)


@router.get("/{run}/autopilot", responses=NOT_FOUND)
def get_run_autopilot(store: StoreDep, run: RunId) -> AutopilotOut:
    """Whether the run's autopilot is on, its settings, its state and its last decision."""
    return _out(run, get_autopilot(store, run))


@router.put(
    "/{run}/autopilot",
    responses=WRITE_RESPONSES,
)
def put_run_autopilot(
    store: StoreDep, _actor: ActorDep, run: RunId, body: AutopilotIn
) -> AutopilotOut:
    """Turn the autopilot on (again, after it gave up) or off, with these settings."""
    return _out(run, set_autopilot(store, run, body.model_dump(exclude_none=True)))


@router.delete("/{run}/autopilot", responses={k: v for k, v in WRITE_RESPONSES.items() if k != 409})
def delete_run_autopilot(store: StoreDep, _actor: ActorDep, run: RunId) -> AutopilotOut:
    """Turn the autopilot off at once: it files nothing more (a request it filed already
    applies as any other)."""
    return _out(run, disable_autopilot(store, run))
