"""Who may do what: every request to a guarded route is let through, or refused (401,
403, 429), before its body is read or its route runs.

The role a route needs is :mod:`scalewatch.app.middleware.roles`'s; who the request comes from is
:mod:`scalewatch.app.middleware.identity`'s; the identity let through is in
``request.state.identity`` (None: an anonymous read, open on a service bound to loopback
or started ``--public-read``).
"""

from __future__ import annotations

import hmac
import ipaddress
import json
import math
from urllib.parse import parse_qs

from sqlalchemy.exc import DBAPIError
from starlette.concurrency import run_in_threadpool
from starlette.datastructures import Headers
from starlette.types import ASGIApp, Receive, Scope, Send

from scalewatch.store.identities import Role, TokenRefusal

from ..services import services_of
from ..settings import Settings
from .hosts import is_loopback
from .identity import (
    BOOTSTRAP_NAME,
    Identity,
    from_proxy,
    from_token,
    in_networks,
)
from .roles import TICKET_PATHS, needed

__all__ = ["Access", "Refusal", "current_identity", "reads_open"]

MISSING = "a bearer token is required: 'Authorization: Bearer <token>'"
REFUSED = {
    TokenRefusal.UNKNOWN: "the bearer token is unknown",
    TokenRefusal.REVOKED: "the bearer token was revoked",
    TokenRefusal.EXPIRED: "the bearer token has expired",
}


class Refusal(Exception):
    def __init__(self, status: int, detail: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(detail)
        self.status, self.detail, self.headers = status, detail, headers or {}


def current_identity(scope: Scope) -> Identity | None:
    identity: Identity | None = scope.get("state", {}).get("identity")
    return identity


def reads_open(settings: Settings) -> bool:
    """Whether a read needs no token: bound to loopback (unless ``private_read``), or
    ``public_read``."""
    return settings.public_read or (is_loopback(settings.host) and not settings.private_read)


class Access:
    """The guard, as ASGI middleware of the app built with ``settings``."""

    def __init__(self, app: ASGIApp, settings: Settings) -> None:
        self.app, self.settings = app, settings
        self.reads_open = reads_open(settings)
        self.trusted = tuple(
            ipaddress.ip_network(cidr, strict=False) for cidr in settings.trust_proxy
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path, need = needed(scope["method"], scope["path"]) or ("", None)
        if need is not None:
            try:
                identity = await self._identify(scope, path, open_read=need is Role.VIEWER)
                self._judge(identity, need)
            except Refusal as refused:
                await _refuse(send, refused)
                return
            scope.setdefault("state", {})["identity"] = identity
        await self.app(scope, receive, send)

    async def _identify(self, scope: Scope, path: str, *, open_read: bool) -> Identity | None:
        client = scope["client"][0] if scope.get("client") else "unknown"
        services = services_of(scope["app"])
        penalty = services.penalty  # wrong tokens per client
        locked = penalty.locked_for(client)
        if locked > 0 and (_credentials(scope, path) or not (open_read and self.reads_open)):
            wait = str(math.ceil(locked))
            raise Refusal(
                429,
                f"too many wrong tokens from {client}: try again in {wait} s",
                {"Retry-After": wait},
            )
        headers = Headers(scope=scope)
        store = services.store
        found: Identity | TokenRefusal | None = None
        user = self.settings.proxy_user_header
        if user and self.trusted and in_networks(client, self.trusted) and headers.get(user):
            role = (
                headers.get(self.settings.proxy_role_header or "")
                if self.settings.proxy_role_header
                else None
            )
            found = await _from_store(from_proxy, store, headers[user], role)
        elif "authorization" in headers:
            scheme, _, token = headers["authorization"].partition(" ")
            token = token.strip()
            if scheme.lower() != "bearer" or not token:
                found = TokenRefusal.UNKNOWN
            else:
                known = services.known_tokens
                found = (
                    self._bootstrap(token)
                    or known.identity(token)
                    or await _from_store(from_token, store, token, known.clock, known)
                )
        elif path in TICKET_PATHS and "ticket" in (query := _query(scope)):
            found = services.tickets.check(query["ticket"])
            if found is None:
                penalty.failed(client)
                raise Refusal(401, "the stream ticket is wrong or has expired: get a new one")
        if isinstance(found, TokenRefusal):
            penalty.failed(client)
            raise Refusal(401, REFUSED[found], {"WWW-Authenticate": "Bearer"})
        if found is not None and found.source != "ticket":
            penalty.succeeded(client)
        return found

    def _bootstrap(self, token: str) -> Identity | None:
        """The holder of ``SCALEWATCH_TOKEN``, compared in constant time."""
        expected = self.settings.token.get_secret_value() if self.settings.token else ""
        if expected and hmac.compare_digest(token.encode(), expected.encode()):
            return Identity(BOOTSTRAP_NAME, Role.ADMIN, "bootstrap")
        return None

    def _judge(self, identity: Identity | None, need: Role) -> None:
        if identity is None:
            if need is Role.VIEWER and self.reads_open:
                return
            raise Refusal(401, MISSING, {"WWW-Authenticate": "Bearer"})
        if not identity.role.allows(need):
            raise Refusal(403, f"{identity.name!r} has the role {identity.role}: this needs {need}")


async def _from_store(function: object, *args: object) -> Identity | TokenRefusal:
    try:
        found: Identity | TokenRefusal = await run_in_threadpool(function, *args)  # type: ignore[arg-type]
    except DBAPIError:
        raise Refusal(503, "the store cannot be used to check the token") from None
    return found


def _credentials(scope: Scope, path: str) -> bool:
    """Whether the request presents anything that names an identity."""
    headers = Headers(scope=scope)
    return "authorization" in headers or (path in TICKET_PATHS and "ticket" in _query(scope))


def _query(scope: Scope) -> dict[str, str]:
    raw = scope.get("query_string", b"").decode("latin-1")
    return {key: values[-1] for key, values in parse_qs(raw).items()}


async def _refuse(send: Send, refused: Refusal) -> None:
    body = json.dumps({"detail": refused.detail}).encode()
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", b"%d" % len(body)),
        *((k.lower().encode(), v.encode()) for k, v in refused.headers.items()),
    ]
    await send({"type": "http.response.start", "status": refused.status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
