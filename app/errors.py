"""The store's refusals as JSON errors in FastAPI's ``{"detail": ...}`` shape."""

from __future__ import annotations

import math
from typing import Any

from fastapi import FastAPI, HTTPException, Request, status
from fastapi.encoders import jsonable_encoder
from fastapi.exception_handlers import http_exception_handler
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from sqlalchemy.exc import DBAPIError
from starlette.exceptions import HTTPException as StarletteHTTPException

from scalewatch.store.errors import ControlValidationError, RunNotFound, RunNotRunning, StoreDamaged

from .middleware.head import allowed_methods
from .middleware.health import store_unavailable

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
    """NaN and the infinities as strings (JSON has no token for them), and lone surrogates
    (which UTF-8 cannot encode) as their escapes.

    >>> _json_safe({"input": [float("nan"), 1.5, "a\\ud800"]})
    {'input': ['nan', 1.5, 'a\\\\ud800']}
    """
    if isinstance(value, float) and not math.isfinite(value):
        return repr(value)
    if isinstance(value, str):
        return value.encode("utf-8", "backslashreplace").decode("utf-8")
    if isinstance(value, dict):
        return {_json_safe(key): _json_safe(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_json_safe(item) for item in value]
    return value


async def _request_validation(request: Request, exc: Exception) -> JSONResponse:
    if body_not_json(request):
        detail = [{"loc": ["body"], "msg": NOT_JSON, "type": "content_type"}]
        return JSONResponse({"detail": detail}, status.HTTP_422_UNPROCESSABLE_CONTENT)
    # FastAPI's own handler echoes the input, and a NaN there fails to serialise (a 500).
    errors = exc.errors() if isinstance(exc, RequestValidationError) else []
    detail = _json_safe(jsonable_encoder(errors))
    return JSONResponse({"detail": detail}, status_code=status.HTTP_422_UNPROCESSABLE_CONTENT)


NOT_JSON = (
    "the body must be JSON, sent with 'Content-Type: application/json'"
    " (curl: -H 'Content-Type: application/json'; -d alone sends a form)"
)


def body_not_json(request: Request) -> bool:
    """A request with a body that does not say it is JSON: FastAPI then reads it as no
    object at all, and its 422 does not say why (``curl -d`` sends a form)."""
    if request.method not in ("POST", "PUT", "PATCH"):
        return False
    media_type = request.headers.get("content-type", "").partition(";")[0].strip().lower()
    return not (media_type == "application/json" or media_type.endswith("+json"))


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, StarletteHTTPException)
    if exc.status_code == status.HTTP_405_METHOD_NOT_ALLOWED:
        allow = ", ".join(allowed_methods(request.app.router.routes, request.scope))
        exc = StarletteHTTPException(
            405, exc.detail, headers={**(exc.headers or {}), "Allow": allow}
        )
    return await http_exception_handler(request, exc)


async def _not_found(request: Request, exc: Exception) -> JSONResponse:
    return JSONResponse({"detail": str(exc) or "no such run"}, status.HTTP_404_NOT_FOUND)


async def _not_running(request: Request, exc: Exception) -> JSONResponse:
    return JSONResponse({"detail": str(exc) or "the run is not running"}, status.HTTP_409_CONFLICT)


def install_error_handlers(app: FastAPI) -> None:
    app.add_exception_handler(StarletteHTTPException, _http_error)
    app.add_exception_handler(RequestValidationError, _request_validation)
    app.add_exception_handler(ControlValidationError, _validation)
    app.add_exception_handler(RunNotFound, _not_found)
    app.add_exception_handler(RunNotRunning, _not_running)
    app.add_exception_handler(DBAPIError, store_unavailable)
    app.add_exception_handler(StoreDamaged, store_unavailable)
