"""The scalewatch store: SQLite through SQLAlchemy, schema through Alembic.

The trainer writes runs and steps (:mod:`scalewatch.store.runs`) and the loads of its scaler's
state (:mod:`scalewatch.store.scale_loads`); the service reads them
(:mod:`scalewatch.store.queries`) and writes control requests (:mod:`scalewatch.store.control`)
and the autopilot's state (:mod:`scalewatch.store.autopilot`).
"""

from __future__ import annotations

from .engine import Store, downgrade, open_store, upgrade
from .errors import (
    ControlValidationError,
    RequestNotFound,
    RunNotFound,
    RunNotRunning,
)
from .records import ControlRequestRow, RunRef, StepRecord
from .urls import default_url

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
