"""The autopilot's row of a run: its settings (validated against the run's control), its
state and last decision. What it decides on: :mod:`scalewatch.store.summaries`.

The service's autopilot (``app/autopilot``) reads and writes these; its changes are
ordinary control requests (:func:`scalewatch.store.control.request_control`).
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from sqlalchemy import Connection, RowMapping, select, update

from .control import file_request
from .control_rules import INT32_MAX, RULES, SCHEMAS, bounds_problems, normalise
from .engine import Store
from .errors import ControlValidationError, RunNotFound, RunNotRunning
from .runs import effective_status
from .schema import autopilots, runs
from .states import AutopilotState, RequestSource, RunStatus

__all__ = [
    "AUTOPILOT_FIELDS",
    "AUTOPILOT_SCHEMAS",
    "DEFAULT_COOLDOWN_STEPS",
    "DEFAULT_MAX_CHANGES_PER_HOUR",
    "DEFAULT_MAX_GROWTH_INTERVAL",
    "REQUESTED_BY",
    "AutopilotRow",
    "RunFacts",
    "disable_autopilot",
    "enabled_autopilots",
    "get_autopilot",
    "runs_without_autopilot",
    "save_decision",
    "set_autopilot",
    "validate_autopilot",
]

DEFAULT_COOLDOWN_STEPS = 500
DEFAULT_MAX_CHANGES_PER_HOUR = 6
DEFAULT_MAX_GROWTH_INTERVAL = 100_000
REQUESTED_BY = "autopilot"  # the requested_by of its control requests
MAX_CHANGES_PER_HOUR = 3600
AUTOPILOT_FIELDS = (
    "enabled",
    "target_skip_rate",
    "min_growth_interval",
    "max_growth_interval",
    "min_scale",
    "cooldown_steps",
    "max_changes_per_hour",
)
_RULES = {
    "enabled": "enabled must be true or false",
    "target_skip_rate": "target_skip_rate must be a number > 0 and < 1",
    "min_growth_interval": RULES["growth_interval"].replace(
        "growth_interval", "min_growth_interval"
    ),
    "max_growth_interval": RULES["growth_interval"].replace(
        "growth_interval", "max_growth_interval"
    ),
    "min_scale": RULES["min_scale"],
    "cooldown_steps": f"cooldown_steps must be an integer >= 1 and <= {INT32_MAX}",
    "max_changes_per_hour": f"max_changes_per_hour must be an integer >= 1 and <="
    f" {MAX_CHANGES_PER_HOUR}",
}
# Each field's rule above as JSON Schema, for the OpenAPI document (app/autopilot/models.py).
AUTOPILOT_SCHEMAS: dict[str, dict[str, Any]] = {
    "target_skip_rate": {"type": "number", "exclusiveMinimum": 0, "exclusiveMaximum": 1},
    "min_growth_interval": SCHEMAS["growth_interval"],
    "max_growth_interval": SCHEMAS["growth_interval"],
    "min_scale": SCHEMAS["min_scale"],
    "cooldown_steps": SCHEMAS["growth_interval"],
    "max_changes_per_hour": {"type": "integer", "minimum": 1, "maximum": MAX_CHANGES_PER_HOUR},
}


@dataclass(frozen=True, slots=True)
class AutopilotRow:
    """A run's ``autopilots`` row."""

    run_id: int
    enabled: bool
    state: AutopilotState
    target_skip_rate: float
    min_growth_interval: int
    max_growth_interval: int
    min_scale: float | None
    cooldown_steps: int
    max_changes_per_hour: int
    misses: int
    helped_below: float | None
    decision: dict[str, Any] | None
    reason: str | None
    updated_at: float


def _checked(name: str, value: object) -> object | None:
    if name == "enabled":
        return value if isinstance(value, bool) else None
    if name == "target_skip_rate":
        if isinstance(value, bool) or not isinstance(value, int | float):
            return None
        return float(value) if math.isfinite(value) and 0 < value < 1 else None
    if name == "max_changes_per_hour":
        number = normalise("growth_interval", value)
        return number if number is not None and number <= MAX_CHANGES_PER_HOUR else None
    return normalise("min_scale" if name == "min_scale" else "growth_interval", value)


def validate_autopilot(values: Mapping[str, object], control: Mapping[str, Any]) -> dict[str, Any]:
    """``values`` checked and completed with the defaults, given the run's ``control``.

    >>> validate_autopilot({"enabled": True, "target_skip_rate": 0.01},
    ...                    {"growth_interval": 2000})["min_growth_interval"]
    2000
    """
    errors = {str(f): "unknown field" for f in values if f not in AUTOPILOT_FIELDS}
    for name in ("enabled", "target_skip_rate"):
        if name not in values:
            errors[name] = f"{name} is required"
    clean: dict[str, Any] = {}
    for name in AUTOPILOT_FIELDS:
        if name in values and values[name] is not None:
            checked = _checked(name, values[name])
            if checked is None:
                errors[name] = _RULES[name]
            else:
                clean[name] = checked
    if "min_scale" in clean:
        errors.update(bounds_problems({"min_scale": clean["min_scale"]}, control))
    low, high = clean.get("min_growth_interval"), clean.get("max_growth_interval")
    if low is not None and high is not None and low > high:
        errors["min_growth_interval"] = (
            f"min_growth_interval must be <= max_growth_interval ({high})"
        )
    if errors:
        raise ControlValidationError(errors)
    interval = int(control.get("growth_interval") or 1)
    high = high if high is not None else max(DEFAULT_MAX_GROWTH_INTERVAL, low or 1)
    clean["min_growth_interval"] = low if low is not None else min(interval, high)
    clean["max_growth_interval"] = high
    clean.setdefault("min_scale", None)
    clean.setdefault("cooldown_steps", DEFAULT_COOLDOWN_STEPS)
    clean.setdefault("max_changes_per_hour", DEFAULT_MAX_CHANGES_PER_HOUR)
    return clean


def _run(conn: Connection, run_id: int) -> Any:
    row = conn.execute(
        select(runs.c.status, runs.c.heartbeat_at, runs.c.control).where(runs.c.id == run_id)
    ).first()
    if row is None:
        raise RunNotFound(run_id)
    return row._mapping


def set_autopilot(
    store: Store, run_id: int, values: Mapping[str, object], *, now: float | None = None
) -> AutopilotRow:
    """Turn the autopilot of the running run ``run_id`` on (or off) with ``values``; a
    new start after it gave up. Raises RunNotFound, RunNotRunning, ControlValidationError."""
    now = time.time() if now is None else now
    with store.write() as conn:
        run = _run(conn, run_id)
        clean = validate_autopilot(values, run["control"])
        status = effective_status(run, now)
        if clean["enabled"] and status is not RunStatus.RUNNING:
            raise RunNotRunning(run_id, status)
        state = AutopilotState.WATCHING if clean["enabled"] else AutopilotState.OFF
        row = {**clean, "state": state, "misses": 0, "helped_below": None, "reason": None}
        row["updated_at"] = now
        done = conn.execute(update(autopilots).where(autopilots.c.run_id == run_id).values(row))
        if done.rowcount == 0:
            conn.execute(autopilots.insert().values(run_id=run_id, decision=None, **row))
        return _get(conn, run_id)


def disable_autopilot(
    store: Store, run_id: int, *, now: float | None = None
) -> AutopilotRow | None:
    """Turn the run's autopilot off at once (its settings kept); None if it never had one."""
    with store.write() as conn:
        _run(conn, run_id)
        conn.execute(
            update(autopilots)
            .where(autopilots.c.run_id == run_id)
            .values(
                enabled=False,
                state=AutopilotState.OFF,
                updated_at=time.time() if now is None else now,
            )
        )
        return _find(conn, run_id)


def get_autopilot(store: Store, run_id: int, *, now: float | None = None) -> AutopilotRow | None:
    """The run's autopilot row, or None if it never had one. Raises RunNotFound.

    One watching a run that ended (finished, crashed or silent) reads as ``ended``: it acts
    no more. Its row keeps ``watching``, so a run resumed is watched again."""
    with store.read() as conn:
        run = _run(conn, run_id)
        row = _find(conn, run_id)
    if row is None or row.state is not AutopilotState.WATCHING:
        return row
    if effective_status(run, now) is RunStatus.RUNNING:
        return row
    return replace(row, state=AutopilotState.ENDED)


@dataclass(frozen=True, slots=True)
class RunFacts:
    """What the autopilot reads of a run's row."""

    status: RunStatus
    last_step: int
    control: dict[str, Any]


def enabled_autopilots(
    store: Store, *, now: float | None = None
) -> list[tuple[AutopilotRow, RunFacts]]:
    """Every run whose autopilot is on and watching, by run id, with its run's facts: one
    query."""
    now = time.time() if now is None else now
    query = (
        select(autopilots, runs.c.status, runs.c.heartbeat_at, runs.c.last_step, runs.c.control)
        .join(runs, runs.c.id == autopilots.c.run_id)
        .where(autopilots.c.enabled, autopilots.c.state == AutopilotState.WATCHING)
        .order_by(autopilots.c.run_id)
    )
    with store.read() as conn:
        rows = [row._mapping for row in conn.execute(query)]
    own = [column.name for column in autopilots.c]
    return [
        (
            _to_row({name: row[name] for name in own}),
            RunFacts(effective_status(row, now), int(row["last_step"]), dict(row["control"])),
        )
        for row in rows
    ]


def runs_without_autopilot(store: Store, *, now: float | None = None) -> list[tuple[int, str]]:
    """(id, name) of every running run whose autopilot was never set, by id: one query."""
    now = time.time() if now is None else now
    query = (
        select(runs.c.id, runs.c.name, runs.c.status, runs.c.heartbeat_at)
        .outerjoin(autopilots, autopilots.c.run_id == runs.c.id)
        .where(autopilots.c.run_id.is_(None), runs.c.status == RunStatus.RUNNING)
        .order_by(runs.c.id)
    )
    with store.read() as conn:
        rows = [row._mapping for row in conn.execute(query)]
    return [
        (int(row["id"]), str(row["name"]))
        for row in rows
        if effective_status(row, now) is RunStatus.RUNNING
    ]


def save_decision(
    store: Store,
    run_id: int,
    *,
    decision: Mapping[str, Any],
    misses: int,
    helped_below: float | None,
    gave_up: str | None = None,
    change: Mapping[str, object] | None = None,
    now: float | None = None,
) -> bool:
    """Record the autopilot's decision; ``gave_up`` (a reason) stops it. Whether it was
    still on: a switch turned off meanwhile wins, and nothing is written.

    ``change`` (control values) is filed in the same transaction as a control request of
    the autopilot, ``decision["reason"]`` its note (why); the decision is recorded with the
    request's id as ``request_id``, or, refused, with ``request_id`` None and why as
    ``refused``. An autopilot turned off files nothing.
    """
    values: dict[str, Any] = {"misses": misses, "helped_below": helped_below}
    values["updated_at"] = time.time() if now is None else now
    if gave_up is not None:
        values.update(state=AutopilotState.GAVE_UP, reason=gave_up)
    with store.write() as conn:
        # Locked (PostgreSQL; SQLite's write transaction holds the whole file): a switch
        # turned off now waits for this transaction, or this one sees it off.
        on = conn.execute(
            select(autopilots.c.run_id)
            .where(
                autopilots.c.run_id == run_id,
                autopilots.c.enabled,
                autopilots.c.state == AutopilotState.WATCHING,
            )
            .with_for_update()
        ).first()
        if on is None:
            return False
        recorded = dict(decision)
        if change:
            recorded.update(_file(conn, run_id, change, decision.get("reason")))
        conn.execute(
            update(autopilots)
            .where(autopilots.c.run_id == run_id)
            .values(decision=recorded, **values)
        )
        return True


def _file(
    conn: Connection, run_id: int, change: Mapping[str, object], reason: str | None
) -> dict[str, Any]:
    try:
        request = file_request(
            conn,
            run_id,
            change,
            requested_by=REQUESTED_BY,
            source=RequestSource.AUTOPILOT,
            note=reason,
        )
    except (ControlValidationError, RunNotFound, RunNotRunning) as error:
        return {"request_id": None, "refused": str(error)}
    return {"request_id": request.id}


def _find(conn: Connection, run_id: int) -> AutopilotRow | None:
    row = conn.execute(select(autopilots).where(autopilots.c.run_id == run_id)).first()
    return None if row is None else _to_row(row._mapping)


def _get(conn: Connection, run_id: int) -> AutopilotRow:
    found = _find(conn, run_id)
    assert found is not None  # written in this transaction
    return found


def _to_row(row: Mapping[str, Any] | RowMapping) -> AutopilotRow:
    return AutopilotRow(
        **{**dict(row), "state": AutopilotState(row["state"]), "enabled": bool(row["enabled"])}
    )
