"""HEAD on the service's GET routes: FastAPI routes answer GET alone, so ``curl -I`` and
health checkers got 405. Streams and exports stay GET-only: a HEAD would run them whole."""

from __future__ import annotations

from collections.abc import Iterable

from starlette.routing import BaseRoute, Match, Mount
from starlette.types import ASGIApp, Message, Receive, Scope, Send

__all__ = ["HeadAsGet", "allowed_methods"]

WHOLE_ONLY = ("/export", "/stream")  # path endings a HEAD is not worth running for
PROBED_METHODS = ("DELETE", "GET", "HEAD", "OPTIONS", "PATCH", "POST", "PUT")


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


def allowed_methods(routes: Iterable[BaseRoute], scope: Scope) -> list[str]:
    """The methods that the routes at the path of ``scope`` take together, HEAD included
    where :class:`HeadAsGet` answers it: the ``Allow`` of a 405 (Starlette names those of
    the first route at the path alone, and a path's GET and POST are two routes). A path
    that only a mount takes is the static files': GET and HEAD.

    Each method is tried on the routes as the router would match it, so routers included
    in routers count too.
    """
    routes = list(routes)
    mounts = [route for route in routes if isinstance(route, Mount)]
    routes = [route for route in routes if not isinstance(route, Mount)]
    methods = {
        method
        for method in PROBED_METHODS
        if any(route.matches({**scope, "method": method})[0] is Match.FULL for route in routes)
    }
    if not methods and any(mount.matches(scope)[0] is Match.FULL for mount in mounts):
        methods = {"GET", "HEAD"}
    if "GET" in methods and not scope.get("path", "").endswith(WHOLE_ONLY):
        methods.add("HEAD")
    return sorted(methods)
