"""Which hosts a service answers: loopback names, and the ``Host`` check (DNS rebinding)
of a service bound to loopback. The service process, on each request."""

from __future__ import annotations

import ipaddress
import json
from collections.abc import Iterable

from starlette.datastructures import Headers
from starlette.types import ASGIApp, Receive, Scope, Send

__all__ = ["LoopbackHost", "host_name", "is_loopback"]


def is_loopback(host: str) -> bool:
    """``127.0.0.1``, ``::1`` and ``localhost`` are; ``0.0.0.0`` and real addresses are not."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def host_name(host_header: str) -> str:
    """The name in a ``Host`` header, without its port.

    >>> host_name("127.0.0.1:8765"), host_name("[::1]:8765"), host_name("Localhost")
    ('127.0.0.1', '::1', 'localhost')
    """
    if host_header.startswith("["):
        return host_header[1:].partition("]")[0]
    return host_header.rpartition(":")[0].lower() if ":" in host_header else host_header.lower()


class LoopbackHost:
    """Refuse (400) a request whose ``Host`` names neither a loopback address nor one of
    ``allowed``: a service bound to loopback is then out of reach of a web page whose
    name was made to resolve to 127.0.0.1 (DNS rebinding), as it sends its own name.
    """

    def __init__(self, app: ASGIApp, allowed: Iterable[str] = ()) -> None:
        self.app = app
        self.allowed = {name.strip().lower() for name in allowed if name.strip()}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        header = Headers(scope=scope).get("host") if scope["type"] == "http" else None
        if header is None or self._ok(host_name(header)):
            await self.app(scope, receive, send)
            return
        body = json.dumps(
            {"detail": "Host header names neither loopback nor SCALEWATCH_ALLOWED_HOSTS"}
        ).encode()
        headers = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(body))]
        await send({"type": "http.response.start", "status": 400, "headers": headers})
        await send({"type": "http.response.body", "body": body})

    def _ok(self, name: str) -> bool:
        return is_loopback(name) or name in self.allowed or "*" in self.allowed
