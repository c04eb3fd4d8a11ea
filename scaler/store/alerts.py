"""Alerts in the store: fired once, resolved once, listed for the API, the CLI and metrics.

>>> from scalewatch.store.engine import open_store
>>> from scalewatch.store.runs import create_run
>>> store = open_store("sqlite://")
>>> run = create_run(store, name="demo", world_size=1, config={}, control={})
>>> alert = fire_alert(store, Firing(run.id, "floor", "scale_below", 1.0, 0.5, "", 7, 70.0))
>>> alert.state, alert.fired_step
(<AlertState.FIRING: 'firing'>, 7)
>>> resolve_alert(store, alert.id, step=9, at=90.0, value=2.0).resolved_step
9
>>> resolve_alert(store, alert.id, step=10, at=91.0, value=2.0) is None  # once only
True
>>> store.close()
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from sqlalchemy import RowMapping, exc, select, update

from .engine import Store
from .schema import alerts, runs
from .states import AlertState

__all__ = [
    "AlertRow",
    "Firing",
    "alert_page",
    "fire_alert",
    "firing_alerts",
    "resolve_alert",
]


@dataclass(frozen=True)
class Firing:
    """What a rule found when its condition started on a run."""

    run_id: int
    rule: str
    kind: str
    threshold: float
    value: float
    detail: str
    step: int
    at: float


@dataclass(frozen=True)
class AlertRow:
    """One row of ``alerts``, with the name of its run."""

    id: int
    run_id: int
    run_name: str
    rule: str
    kind: str
    state: AlertState
    threshold: float
    value: float
    detail: str
    fired_step: int
    fired_at: float
    resolved_step: int | None
    resolved_at: float | None
    resolved_value: float | None

    @property
    def step(self) -> int:
        """Where it fired, or where it resolved once resolved."""
        resolved = self.state is AlertState.RESOLVED and self.resolved_step is not None
        return (
            self.resolved_step if resolved and self.resolved_step is not None else self.fired_step
        )

    @property
    def current_value(self) -> float:
        """The value when it fired, or when it resolved once resolved."""
        if self.state is AlertState.RESOLVED and self.resolved_value is not None:
            return self.resolved_value
        return self.value

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


_SELECT = select(*alerts.c, runs.c.name.label("run_name")).join(runs, runs.c.id == alerts.c.run_id)


def _row(row: RowMapping) -> AlertRow:
    values = dict(row)
    values["state"] = AlertState(values["state"])
    return AlertRow(**values)


def fire_alert(store: Store, firing: Firing) -> AlertRow | None:
    """Store a firing alert; None when one of the same run and rule is firing already
    (fired by another service over the same store)."""
    try:
        with store.write() as conn:
            result = conn.execute(
                alerts.insert().values(
                    run_id=firing.run_id,
                    rule=firing.rule,
                    kind=firing.kind,
                    state=AlertState.FIRING,
                    threshold=firing.threshold,
                    value=firing.value,
                    detail=firing.detail,
                    fired_step=firing.step,
                    fired_at=firing.at,
                )
            )
            key = result.inserted_primary_key
            assert key is not None  # an INSERT of one row always has one
            row = conn.execute(_SELECT.where(alerts.c.id == key[0])).one()
    except exc.IntegrityError:
        return None
    return _row(row._mapping)


def resolve_alert(
    store: Store, alert_id: int, *, step: int, at: float, value: float
) -> AlertRow | None:
    """Mark a firing alert resolved; None when it is not firing (resolved already)."""
    with store.write() as conn:
        changed = conn.execute(
            update(alerts)
            .where(alerts.c.id == alert_id, alerts.c.state == AlertState.FIRING)
            .values(
                state=AlertState.RESOLVED, resolved_step=step, resolved_at=at, resolved_value=value
            )
        ).rowcount
        if not changed:
            return None
        row = conn.execute(_SELECT.where(alerts.c.id == alert_id)).one()
    return _row(row._mapping)


def firing_alerts(store: Store, run_id: int | None = None) -> list[AlertRow]:
    """The alerts firing now (of one run), oldest first."""
    query = _SELECT.where(alerts.c.state == AlertState.FIRING).order_by(alerts.c.id)
    if run_id is not None:
        query = query.where(alerts.c.run_id == run_id)
    with store.read() as conn:
        return [_row(row._mapping) for row in conn.execute(query)]


def alert_page(
    store: Store,
    *,
    run_id: int | None = None,
    state: AlertState | None = None,
    before: int | None = None,
    limit: int = 100,
) -> tuple[list[AlertRow], int | None]:
    """Alerts newest first, keyset-paged on the id; the second value is the ``before`` of
    the next (older) page, None at the oldest."""
    query = _SELECT.order_by(alerts.c.id.desc()).limit(limit + 1)
    if run_id is not None:
        query = query.where(alerts.c.run_id == run_id)
    if state is not None:
        query = query.where(alerts.c.state == state)
    if before is not None:
        query = query.where(alerts.c.id < before)
    with store.read() as conn:
        rows = [_row(row._mapping) for row in conn.execute(query)]
    return rows[:limit], rows[limit - 1].id if len(rows) > limit else None
