"""The service's routers, gathered in one place."""

from __future__ import annotations

from fastapi import APIRouter

from ..models import ErrorMessage
from . import (
    alerts,
    autopilot,
    control,
    diagnosis,
    export,
    ingest,
    metrics,
    rules,
    runs,
    spikes,
    stream,
    tokens,
)

__all__ = ["STORE_UNAVAILABLE", "router"]

STORE_UNAVAILABLE: dict[int | str, dict[str, object]] = {
    503: {"model": ErrorMessage, "description": "the store cannot be used (damaged, unreadable)"}
}

router = APIRouter()
for module in (
    runs,
    diagnosis,
    spikes,
    alerts,
    control,
    autopilot,
    rules,
    export,
    stream,
    metrics,
    tokens,
    ingest,
):
    router.include_router(module.router, responses=STORE_UNAVAILABLE)
