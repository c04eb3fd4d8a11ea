"""The bearer token that guards mutating routes, and the loopback-only default bind."""

from __future__ import annotations

import hmac
import ipaddress
import json
import os
import secrets
from collections.abc import Iterable
from pathlib import Path

from starlette.datastructures import Headers
from starlette.types import ASGIApp, Receive, Scope, Send

__all__ = [
    "LoopbackHost",
    "check_token",
    "host_name",
    "is_loopback",
    "new_token",
    "write_token_file",
]


def new_token() -> str:
    return secrets.token_urlsafe(32)


def check_token(authorization: str | None, expected: str | None) -> bool:
    """Whether an ``Authorization`` header carries the expected bearer token.

    >>> check_token("Bearer abc", "abc"), check_token("Bearer abd", "abc"), check_token(None, "abc")
    (True, False, False)
    """
    if not expected or not authorization:
        return False
    scheme, _, presented = authorization.partition(" ")
    if scheme.lower() != "bearer":
        return False
    return hmac.compare_digest(presented.strip().encode(), expected.encode())


def is_loopback(host: str) -> bool:
    """``127.0.0.1``, ``::1`` and ``localhost`` are; ``0.0.0.0`` and real addresses are not."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def write_token_file(path: Path, token: str) -> Path:
    """Write ``token`` to ``path``, readable and writable by its owner only (0600)."""
    path = path.expanduser()
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.fchmod(fd, 0o600)
        os.write(fd, (token + "\n").encode())
    finally:
        os.close(fd)
    return path


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
