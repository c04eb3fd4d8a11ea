"""HEAD on the service's GET routes: FastAPI routes answer GET alone, so ``curl -I`` and
health checkers got 405. Streams and exports stay GET-only: a HEAD would run them whole."""

from __future__ import annotations

from starlette.types import ASGIApp, Message, Receive, Scope, Send

__all__ = ["HeadAsGet"]

WHOLE_ONLY = ("/export", "/stream")  # path endings a HEAD is not worth running for


class HeadAsGet:
    """Answer a HEAD as its GET would be answered (status and headers), without the body."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope.get("path", "")
        if scope["type"] != "http" or scope["method"] != "HEAD" or path.endswith(WHOLE_ONLY):
            await self.app(scope, receive, send)
            return

        async def headers_only(message: Message) -> None:
            if message["type"] != "http.response.body":
                await send(message)
            elif not message.get("more_body", False):
                await send({"type": "http.response.body", "body": b""})

        await self.app({**scope, "method": "GET"}, receive, headers_only)
