"""Alerts: those of every run, and those of one."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query

from scalewatch.store.alerts import AlertRow, alert_page
from scalewatch.store.queries import INT64_MAX
from scalewatch.store.states import AlertState

from ..alerts.text import alert_text, said
from ..deps import StoreDep
from ..models import AlertList, AlertOut, AlertRun
from .runs import NOT_FOUND, RunId, require_run_exists

router = APIRouter(tags=["alerts"])

State = Annotated[AlertState | None, Query(description="only firing, or only resolved")]
Before = Annotated[int | None, Query(ge=1, le=INT64_MAX, description="ids below this one")]
Limit = Annotated[int, Query(ge=1, le=10_000)]


def alert_out(alert: AlertRow) -> AlertOut:
    return AlertOut(
        id=alert.id,
        rule=alert.rule,
        kind=alert.kind,
        state=alert.state,
        run=AlertRun(id=alert.run_id, name=alert.run_name),
        threshold=alert.threshold,
        value=alert.value,
        detail=alert.detail,
        text=alert_text(alert),
        says=said(alert.kind, alert.value, alert.threshold, alert.detail),
        fired_step=alert.fired_step,
        fired_at=alert.fired_at,
        resolved_step=alert.resolved_step,
        resolved_at=alert.resolved_at,
        resolved_value=alert.resolved_value,
    )


def _page(rows: tuple[list[AlertRow], int | None]) -> AlertList:
    return AlertList(alerts=[alert_out(row) for row in rows[0]], next=rows[1])


@router.get("/api/alerts")
def list_alerts(
    store: StoreDep, state: State = None, before: Before = None, limit: Limit = 100
) -> AlertList:
    """Alerts of every run, newest first, keyset-paged by id."""
    return _page(alert_page(store, state=state, before=before, limit=limit))


@router.get("/api/runs/{run}/alerts", responses=NOT_FOUND)
def run_alerts(
    store: StoreDep, run: RunId, state: State = None, before: Before = None, limit: Limit = 1000
) -> AlertList:
    """The alerts of one run, newest first, keyset-paged by id."""
    require_run_exists(store, run)
    return _page(alert_page(store, run_id=run, state=state, before=before, limit=limit))
