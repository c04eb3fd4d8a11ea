"""A cap on the requests one client has in flight at once: beyond it, 429 at once.

Each HTTP/1.1 connection carries one request at a time, so this bounds the connections a
client keeps busy: slow bodies (each bounded in time by
:mod:`~scalewatch.app.middleware.limits`), live streams, slow exports. The client is the
address the request's scope names, as every other middleware reads it.
"""

from __future__ import annotations

import json
from collections import Counter

from starlette.types import ASGIApp, Receive, Scope, Send

__all__ = ["ClientCap"]


class ClientCap:
    """Refuse a request with 429 while its client has ``max_requests`` others in flight."""

    def __init__(self, app: ASGIApp, *, max_requests: int) -> None:
        self.app, self.max_requests = app, max_requests
        self._in_flight: Counter[str] = Counter()  # the event loop's alone: no lock

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        client = scope["client"][0] if scope.get("client") else "unknown"
        if self._in_flight[client] >= self.max_requests:
            await _refuse(send, client, self.max_requests)
            return
        self._in_flight[client] += 1
        try:
            await self.app(scope, receive, send)
        finally:
            self._in_flight[client] -= 1
            if not self._in_flight[client]:
                del self._in_flight[client]


async def _refuse(send: Send, client: str, most: int) -> None:
    detail = f"{client} has {most} requests in flight, the most one client may: retry later"
    body = json.dumps({"detail": detail}).encode()
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
        (b"retry-after", b"1"),
        (b"connection", b"close"),
    ]
    await send({"type": "http.response.start", "status": 429, "headers": headers})
    await send({"type": "http.response.body", "body": body})
