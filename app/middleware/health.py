"""The store's health as the service sees it: the last storage failure a request met.

A damaged page of one table fails only the requests that read it; ``/healthz`` probes a
little of the store, so it also remembers what the requests met, for a while.
"""

from __future__ import annotations

import logging
import time

from fastapi import Request, status
from fastapi.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from scalewatch.store.errors import storage_failure

from ..services import services_of

__all__ = ["FAILURE_MEMORY_S", "StorageGuard", "StoreHealth", "store_unavailable"]

log = logging.getLogger("scalewatch.app.health")

# How long /healthz reports a failure a request met after the last one.
FAILURE_MEMORY_S = 30.0


class StoreHealth:
    def __init__(self, memory_s: float = FAILURE_MEMORY_S) -> None:
        self.memory_s = memory_s
        self._last: tuple[float, str] | None = None

    def failed(self, reason: str) -> None:
        self._last = (time.monotonic(), reason)

    def problem(self) -> str | None:
        """The reason of the last failure, while it is recent; else None."""
        if self._last is None or time.monotonic() - self._last[0] > self.memory_s:
            return None
        return self._last[1]


async def store_unavailable(request: Request, exc: Exception) -> JSONResponse:
    """503 with the reason in one line (and one line in the log, no traceback) for a store
    that cannot be used as it is; any other database error stays a 500: a bug."""
    reason = storage_failure(exc)
    if reason is None:
        raise exc
    services_of(request.app).health.failed(reason)
    log.warning(
        "scalewatch: %s %s: the store cannot be used: %s", request.method, request.url.path, reason
    )
    return JSONResponse(
        {"detail": f"the store cannot be used: {reason}"},
        status.HTTP_503_SERVICE_UNAVAILABLE,
        headers={"Retry-After": "10"},
    )


def _storage_reason(error: BaseException | None) -> str | None:
    """:func:`storage_failure` of ``error`` or of what it was raised from (Starlette wraps an
    exception raised once the answer has started)."""
    while error is not None:
        reason = storage_failure(error)
        if reason is not None:
            return reason
        error = error.__cause__ or error.__context__
    return None


class StorageGuard:
    """A storage failure once an answer has started (a streamed export, a live stream):
    the answer is cut short, so the client sees it incomplete, never whole, and the log
    gets one line, not a traceback."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def tracked(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, receive, tracked)
        except Exception as error:
            reason = _storage_reason(error)
            if reason is None or not started:
                raise
            services_of(scope["app"]).health.failed(reason)
            log.warning(
                "scalewatch: %s cut short: the store cannot be used: %s", scope["path"], reason
            )
