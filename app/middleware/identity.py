"""Who a request comes from: the bootstrap token, a token of the store, a trusted proxy's
header, a stream ticket, or nobody.

A stream ticket is what a browser puts in the URL of an EventSource or a download link,
which cannot carry an ``Authorization`` header: ``<expiry>.<role>.<name>.<signature>``,
HMAC-SHA256 under a key this process drew at start, good for ``TICKET_S`` seconds and
only on the routes of ``scalewatch.app.middleware.roles.TICKET_PATHS``. A URL lands in access
logs; a ticket there is of no use a minute later, where a token would be.

>>> tickets = Tickets(key=b"k" * 32)
>>> ticket = tickets.issue(Identity("ada", Role.VIEWER, "token"), now=100.0)
>>> tickets.check(ticket, now=101.0)
Identity(name='ada', role=<Role.VIEWER: 'viewer'>, source='ticket')
>>> tickets.check(ticket, now=100.0 + TICKET_S) is None
True
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import re
import secrets
import threading
import time
from dataclasses import dataclass, field

from scalewatch.store.engine import Store
from scalewatch.store.identities import (
    Role,
    TokenRefusal,
    check_token,
    proxy_identity,
    touch_identity,
)

__all__ = [
    "BOOTSTRAP_NAME",
    "DURATION_PATTERN",
    "TICKET_S",
    "Identity",
    "KnownTokens",
    "Tickets",
    "UsageClock",
    "from_proxy",
    "from_token",
    "parse_duration",
]

# The name of the holder of SCALEWATCH_TOKEN, in the audit trail.
BOOTSTRAP_NAME = "admin"
TICKET_S = 60.0
# The last-used time of an identity is written at most once a minute: not a write a request.
TOUCH_EVERY_S = 60.0
# How long a checked token is known without reading the store again, and the most kept.
KNOWN_S = 5.0
KNOWN_MOST = 10_000


_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
DURATION_PATTERN = r"^[1-9][0-9]{0,5}[smhdw]$"


def parse_duration(text: str) -> float:
    """Seconds of ``30d``, ``12h``, ``45m``, ``90s``, ``2w``.

    >>> parse_duration("30d"), parse_duration("90s")
    (2592000.0, 90.0)
    """
    if not re.fullmatch(DURATION_PATTERN, text):
        raise ValueError(f"{text!r} is no duration: a whole number and s, m, h, d or w (30d)")
    return float(int(text[:-1]) * _UNITS[text[-1]])


@dataclass(frozen=True)
class Identity:
    name: str
    role: Role
    source: str  # token | proxy | ticket | bootstrap
    # An identity of the store, which may be revoked or expire (not SCALEWATCH_TOKEN's):
    # what its open streams and its tickets are checked against (:mod:`.revocations`).
    revocable: bool = field(default=True, repr=False, compare=False)


def from_token(
    store: Store, token: str, clock: UsageClock, known: KnownTokens | None = None
) -> Identity | TokenRefusal:
    """The identity of a bearer ``token`` of the store (not ``SCALEWATCH_TOKEN``'s), kept
    in ``known`` when it names one."""
    found = check_token(store, token)
    if isinstance(found, TokenRefusal):
        return found
    clock.used(store, found.id)
    identity = Identity(found.name, found.role, "token")
    if known is not None:
        known.keep(token, identity, found.id, found.expires_at)
    return identity


class KnownTokens:
    """The identities of the tokens checked in the last ``KNOWN_S`` seconds, by each token's
    SHA-256 (not the token): a request with one costs no read of the store and no trip to a
    worker thread. One revoked through this service is forgotten at once (:meth:`forget`);
    revoked elsewhere (the CLI, another service) it is forgotten when the store's trail of identity
    events moves (:mod:`.revocations`, within a second), and in ``KNOWN_S`` at most. Expiry
    is checked at each use; one whose last-used time is due goes to the store again."""

    def __init__(self, clock: UsageClock) -> None:
        self.clock = clock
        self._known: dict[bytes, tuple[float, Identity, int, float | None]] = {}
        self._lock = threading.Lock()

    def identity(self, token: str) -> Identity | None:
        digest = hashlib.sha256(token.encode()).digest()
        with self._lock:
            entry = self._known.get(digest)
        if entry is None:
            return None
        until, identity, identity_id, expires_at = entry
        now = time.time()
        stale = now >= until or (expires_at is not None and now >= expires_at)
        if stale or self.clock.due(identity_id, now):
            with self._lock:
                self._known.pop(digest, None)
            return None
        return identity

    def keep(
        self, token: str, identity: Identity, identity_id: int, expires_at: float | None
    ) -> None:
        digest = hashlib.sha256(token.encode()).digest()
        with self._lock:
            if len(self._known) >= KNOWN_MOST:  # many tokens at once: start again
                self._known.clear()
            self._known[digest] = (time.time() + KNOWN_S, identity, identity_id, expires_at)

    def forget(self) -> None:
        """Forget every token (an identity was revoked through this service)."""
        with self._lock:
            self._known.clear()


def from_proxy(store: Store, user: str, role: str | None) -> Identity | TokenRefusal | str:
    """The identity of the user a trusted proxy's header names, ``proxy:<user>``, with the
    role its role header names for this request (none, or no role: the record's); or why
    the header names nobody (a one-line reason)."""
    try:
        found = proxy_identity(store, user.strip())
    except ValueError as refused:
        return str(refused)
    if isinstance(found, TokenRefusal):
        return found
    known = {r.value: r for r in Role}
    return Identity(found.name, known.get((role or "").strip().lower(), found.role), "proxy")


class UsageClock:
    """Writes an identity's last-used time at most every ``TOUCH_EVERY_S`` seconds."""

    def __init__(self) -> None:
        self._written: dict[int, float] = {}
        self._lock = threading.Lock()

    def due(self, identity_id: int, now: float) -> bool:
        """Whether the identity's last-used time is to be written again."""
        with self._lock:
            return now - self._written.get(identity_id, float("-inf")) >= TOUCH_EVERY_S

    def used(self, store: Store, identity_id: int) -> None:
        now = time.time()
        with self._lock:
            if now - self._written.get(identity_id, float("-inf")) < TOUCH_EVERY_S:
                return
            self._written[identity_id] = now
        touch_identity(store, identity_id, now)


class Tickets:
    """Short-lived signed tickets for the streams and exports of a browser."""

    def __init__(self, key: bytes | None = None) -> None:
        self._key = key if key is not None else secrets.token_bytes(32)

    def _sign(self, body: str) -> str:
        digest = hmac.new(self._key, body.encode(), hashlib.sha256).digest()
        return base64.urlsafe_b64encode(digest).decode().rstrip("=")

    def issue(self, identity: Identity, now: float | None = None) -> str:
        expiry = int((time.time() if now is None else now) + TICKET_S)
        name = base64.urlsafe_b64encode(identity.name.encode()).decode().rstrip("=")
        body = f"{expiry}.{identity.role.value}.{'r' if identity.revocable else 'b'}.{name}"
        return f"{body}.{self._sign(body)}"

    def check(self, ticket: str, now: float | None = None) -> Identity | None:
        """The identity of a ticket this process issued and that has not expired; else None."""
        body, _, signature = ticket.rpartition(".")
        if not hmac.compare_digest(signature.encode(), self._sign(body).encode()):
            return None
        expiry, role, kind, name = body.split(".", 3)  # signed by us: well formed
        if int(expiry) <= (time.time() if now is None else now):
            return None
        padded = name + "=" * (-len(name) % 4)
        decoded = base64.urlsafe_b64decode(padded).decode()
        return Identity(decoded, Role(role), "ticket", revocable=kind == "r")
