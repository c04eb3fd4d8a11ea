"""A cap on request bodies: a larger one is refused with 413 before it is held in memory,
and one that takes too long to arrive (a client trickling it) with 408."""

from __future__ import annotations

import json

import anyio
from starlette.datastructures import Headers
from starlette.types import ASGIApp, Message, Receive, Scope, Send

__all__ = ["INGEST_MAX_BODY_BYTES", "INGEST_PREFIX", "MAX_BODY_BYTES", "BodyLimit"]

MAX_BODY_BYTES = 64 * 1024
# A job's batch of records (app/routes/ingest): larger, from a token that may write alone.
INGEST_PREFIX = "/api/ingest/"
INGEST_MAX_BODY_BYTES = 4 * 1024 * 1024
_NO_BODY = frozenset({"GET", "HEAD", "OPTIONS"})


class BodyLimit:
    """Read a request's body ahead, up to ``max_bytes`` and for ``timeout_s`` at most, then
    hand it to ``app`` whole.

    A declared ``Content-Length`` over the cap is refused without reading a byte; a chunked
    body is refused as soon as it passes the cap; a body not whole ``timeout_s`` after the
    app began to read it, with 408, and the connection is closed.
    """

    def __init__(
        self,
        app: ASGIApp,
        *,
        timeout_s: float,
        max_bytes: int = MAX_BODY_BYTES,
        ingest_max_bytes: int = INGEST_MAX_BODY_BYTES,
    ) -> None:
        self.app, self.max_bytes, self.timeout_s = app, max_bytes, timeout_s
        self.ingest_max_bytes = ingest_max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] in _NO_BODY:
            await self.app(scope, receive, send)
            return
        cap = self.ingest_max_bytes if scope["path"].startswith(INGEST_PREFIX) else self.max_bytes
        declared = Headers(scope=scope).get("content-length")
        if declared is not None and (not declared.isdigit() or int(declared) > cap):
            await _refuse(send, 413, f"request body over {cap} bytes")
            return
        try:
            with anyio.fail_after(self.timeout_s):
                body = await self._read(receive, cap)
        except TimeoutError:
            await _refuse(send, 408, f"request body not received within {self.timeout_s:g} s")
            return
        except _TooLarge:
            await _refuse(send, 413, f"request body over {cap} bytes")
            return
        if body is None:
            return  # the client left before sending its body
        whole: Message = {"type": "http.request", "body": body, "more_body": False}
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if replayed:
                return await receive()
            replayed = True
            return whole

        await self.app(scope, replay, send)

    async def _read(self, receive: Receive, cap: int) -> bytes | None:
        """The whole body; None when the client left. Raises :class:`_TooLarge` as soon as
        it passes the cap."""
        chunks, size = [], 0
        while True:
            message = await receive()
            if message["type"] != "http.request":
                return None
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > cap:
                raise _TooLarge
            chunks.append(chunk)
            if not message.get("more_body", False):
                return b"".join(chunks)


class _TooLarge(Exception):
    pass


async def _refuse(send: Send, status: int, detail: str) -> None:
    body = json.dumps({"detail": detail}).encode()
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
        (b"connection", b"close"),
    ]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
