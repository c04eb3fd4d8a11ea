"""Who may do what: every request to a guarded route is let through, or refused (401,
403, 429), before its body is read or its route runs.

The role a route needs is :mod:`scalewatch.app.middleware.roles`'s; who the request comes from is
:mod:`scalewatch.app.middleware.identity`'s; the identity let through is in
``request.state.identity`` (None: an anonymous read, open on a service bound to loopback
or started ``--public-read``).
"""

from __future__ import annotations

import hmac
import json
import math
from collections.abc import Callable
from typing import Any
from urllib.parse import parse_qs

from sqlalchemy.exc import DBAPIError
from starlette.concurrency import run_in_threadpool
from starlette.datastructures import Headers
from starlette.types import ASGIApp, Receive, Scope, Send

from scalewatch.store.engine import Store
from scalewatch.store.identities import Role, TokenRefusal

from ..services import services_of
from ..settings import Settings
from .hosts import is_loopback
from .identity import BOOTSTRAP_NAME, Identity, from_proxy, from_token
from .penalty import credential_key
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
        # The client as ClientAddress decided it (behind a trusted proxy: the one it
        # forwards for); a unix socket's peer has no address.
        client = scope["client"][0] if scope.get("client") else "unix"
        services = services_of(scope["app"])
        headers = Headers(scope=scope)
        user = self.settings.proxy_user_header
        if user and scope.get("state", {}).get("via_proxy") and headers.get(user, "").strip():
            # Named by the proxy, which authenticated the user: nothing here to guess.
            return await self._from_proxy(services.store, headers, user)
        penalty = services.penalty  # wrong credentials per client
        scheme, token, ticket = "", "", None
        if "authorization" in headers:
            scheme, _, token = headers["authorization"].partition(" ")
            token = token.strip()
        elif path in TICKET_PATHS:
            ticket = _query(scope).get("ticket")
        presented = token or ticket
        credential = credential_key(presented) if presented else None
        locked = penalty.locked_for(client, credential)
        if locked > 0 and (
            "authorization" in headers or ticket is not None or not (open_read and self.reads_open)
        ):
            wait = str(math.ceil(locked))
            raise Refusal(
                429,
                f"too many wrong tokens from {client}: try again in {wait} s",
                {"Retry-After": wait},
            )
        found: Identity | TokenRefusal | None = None
        if "authorization" in headers:
            if scheme.lower() != "bearer" or not token:
                found = TokenRefusal.UNKNOWN
            else:
                known = services.known_tokens
                found = (
                    self._bootstrap(token)
                    or known.identity(token)
                    or await _from_store(from_token, services.store, token, known.clock, known)
                )
        elif ticket is not None:
            found = services.tickets.check(ticket)
            if found is None:
                penalty.failed(client)
                raise Refusal(401, "the stream ticket is wrong or has expired: get a new one")
            if why := services.revocations.refusal(found):
                raise Refusal(401, f"the stream ticket's identity {why}")
        if isinstance(found, TokenRefusal):
            penalty.failed(client)
            raise Refusal(401, REFUSED[found], {"WWW-Authenticate": "Bearer"})
        if found is not None and credential is not None:
            penalty.succeeded(client, credential)
        return found

    async def _from_proxy(self, store: Store, headers: Headers, user: str) -> Identity:
        try:  # HTTP headers arrive as bytes, read as Latin-1: a UTF-8 name is read again
            name = headers[user].encode("latin-1").decode("utf-8")
        except UnicodeError:
            raise Refusal(400, f"the proxy's {user} header is not UTF-8") from None
        role_header = self.settings.proxy_role_header
        role = headers.get(role_header) if role_header else None
        found: Identity | TokenRefusal | str = await _from_store(from_proxy, store, name, role)
        if isinstance(found, TokenRefusal):  # before str: a TokenRefusal is one
            raise Refusal(401, f"the proxy's user was {found.value}")
        if isinstance(found, str):
            raise Refusal(400, f"the proxy's {user} header names no user: {found}")
        return found

    def _bootstrap(self, token: str) -> Identity | None:
        """The holder of ``SCALEWATCH_TOKEN``, compared in constant time."""
        expected = self.settings.token.get_secret_value() if self.settings.token else ""
        if expected and hmac.compare_digest(token.encode(), expected.encode()):
            return Identity(BOOTSTRAP_NAME, Role.ADMIN, "bootstrap", revocable=False)
        return None

    def _judge(self, identity: Identity | None, need: Role) -> None:
        if identity is None:
            if need is Role.VIEWER and self.reads_open:
                return
            raise Refusal(401, MISSING, {"WWW-Authenticate": "Bearer"})
        if not identity.role.allows(need):
            raise Refusal(403, f"{identity.name!r} has the role {identity.role}: this needs {need}")


async def _from_store(function: Callable[..., Any], *args: object) -> Any:
    try:
        found = await run_in_threadpool(function, *args)
    except DBAPIError:
        raise Refusal(503, "the store cannot be used to check the token") from None
    return found


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
