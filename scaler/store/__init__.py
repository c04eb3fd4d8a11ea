"""The scalewatch store: SQLite through SQLAlchemy, schema through Alembic.

The trainer writes runs and steps (:mod:`scaler.store.runs`) and the loads of its scaler's
state (:mod:`scaler.store.scale_loads`); the service reads them
(:mod:`scaler.store.queries`) and writes control requests (:mod:`scaler.store.control`)
and the autopilot's state (:mod:`scaler.store.autopilot`).
"""

from __future__ import annotations

from scaler.store.engine import Store, default_url, downgrade, open_store, upgrade
from scaler.store.errors import (
    ControlValidationError,
    RequestNotFound,
    RunNotFound,
    RunNotRunning,
)
from scaler.store.records import ControlRequestRow, RunRef, StepRecord

__all__ = [
    "ControlRequestRow",
    "ControlValidationError",
    "RequestNotFound",
    "RunNotFound",
    "RunNotRunning",
    "RunRef",
    "StepRecord",
    "Store",
    "default_url",
    "downgrade",
    "open_store",
    "upgrade",
]
