"""The store's refusals as JSON errors in FastAPI's ``{"detail": ...}`` shape."""

from __future__ import annotations

import math
from typing import Any

from fastapi import FastAPI, HTTPException, Request, status
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse

from scaler.store.errors import ControlValidationError, RunNotFound, RunNotRunning

__all__ = ["install_error_handlers", "unprocessable"]


def unprocessable(loc: list[str], msg: str, kind: str = "value_error") -> HTTPException:
    """A 422 in the shape of FastAPI's own validation errors, for checks a route makes itself.

    >>> unprocessable(["query", "end"], "end must not be below start").detail[0]["loc"]
    ['query', 'end']
    """
    return HTTPException(
        status.HTTP_422_UNPROCESSABLE_CONTENT, detail=[{"loc": loc, "msg": msg, "type": kind}]
    )


async def _validation(request: Request, exc: Exception) -> JSONResponse:
    errors = exc.errors if isinstance(exc, ControlValidationError) else {}
    detail = [
        {"loc": ["body", name], "msg": message, "type": "value_error"}
        for name, message in errors.items()
    ]
    return JSONResponse({"detail": detail}, status_code=status.HTTP_422_UNPROCESSABLE_CONTENT)


def _json_safe(value: Any) -> Any:
    """NaN and the infinities as strings: JSON has no token for them.

    >>> _json_safe({"input": [float("nan"), 1.5]})
    {'input': ['nan', 1.5]}
    """
    if isinstance(value, float) and not math.isfinite(value):
        return repr(value)
    if isinstance(value, dict):
        return {key: _json_safe(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_json_safe(item) for item in value]
    return value


async def _request_validation(request: Request, exc: Exception) -> JSONResponse:
    # FastAPI's own handler echoes the input, and a NaN there fails to serialise (a 500).
    errors = exc.errors() if isinstance(exc, RequestValidationError) else []
    detail = _json_safe(jsonable_encoder(errors))
    return JSONResponse({"detail": detail}, status_code=status.HTTP_422_UNPROCESSABLE_CONTENT)


async def _not_found(request: Request, exc: Exception) -> JSONResponse:
    return JSONResponse({"detail": str(exc) or "no such run"}, status.HTTP_404_NOT_FOUND)


async def _not_running(request: Request, exc: Exception) -> JSONResponse:
    return JSONResponse({"detail": str(exc) or "the run is not running"}, status.HTTP_409_CONFLICT)


def install_error_handlers(app: FastAPI) -> None:
    app.add_exception_handler(RequestValidationError, _request_validation)
    app.add_exception_handler(ControlValidationError, _validation)
    app.add_exception_handler(RunNotFound, _not_found)
    app.add_exception_handler(RunNotRunning, _not_running)
