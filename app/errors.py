"""The store's refusals as JSON errors in FastAPI's ``{"detail": ...}`` shape."""

from __future__ import annotations

from fastapi import FastAPI, Request, status
from fastapi.responses import JSONResponse

from scaler.store.errors import ControlValidationError, RunNotFound, RunNotRunning

__all__ = ["install_error_handlers"]


async def _validation(request: Request, exc: Exception) -> JSONResponse:
    errors = exc.errors if isinstance(exc, ControlValidationError) else {}
    detail = [
        {"loc": ["body", name], "msg": message, "type": "value_error"}
        for name, message in errors.items()
    ]
    return JSONResponse({"detail": detail}, status_code=status.HTTP_422_UNPROCESSABLE_CONTENT)


async def _not_found(request: Request, exc: Exception) -> JSONResponse:
    return JSONResponse({"detail": str(exc) or "no such run"}, status.HTTP_404_NOT_FOUND)


async def _not_running(request: Request, exc: Exception) -> JSONResponse:
    return JSONResponse({"detail": str(exc) or "the run is not running"}, status.HTTP_409_CONFLICT)


def install_error_handlers(app: FastAPI) -> None:
    app.add_exception_handler(ControlValidationError, _validation)
    app.add_exception_handler(RunNotFound, _not_found)
    app.add_exception_handler(RunNotRunning, _not_running)
