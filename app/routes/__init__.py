"""The service's routers, gathered in one place."""

from __future__ import annotations

from fastapi import APIRouter

from app.routes import control, export, metrics, runs, stream

__all__ = ["router"]

router = APIRouter()
for module in (runs, control, export, stream, metrics):
    router.include_router(module.router)
