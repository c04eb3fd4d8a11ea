"""Identities in the store: who may use the service, with which role, by which token.

A token is ``sw_<key>_<secret>``: ``key`` (64 random bits, hex) finds the row, ``secret``
(256 random bits) proves it. The store keeps ``key``, a random salt and the SHA-256 of
salt and secret, never the token. A fast hash is enough: a secret of 256 random bits
cannot be guessed from its hash however fast the hash; the salt keeps two stores' rows
(or one token made twice) from telling anything by their hashes. A slow hash (bcrypt)
would cost every request tens of milliseconds for nothing.

>>> from scalewatch.store.engine import open_store
>>> store = open_store("sqlite://")
>>> made = create_identity(store, "ada", Role.OPERATOR, by="admin", now=10.0)
>>> made.token.startswith("sw_"), len(made.token) >= 20 + 43
(True, True)
>>> check_token(store, made.token, now=11.0).name
'ada'
>>> revoke_identity(store, "ada", by="admin", now=12.0).revoked_at
12.0
>>> check_token(store, made.token, now=13.0)
<TokenRefusal.REVOKED: 'revoked'>
>>> store.close()
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
import time
from dataclasses import dataclass
from enum import StrEnum

from sqlalchemy import Connection, RowMapping, func, insert, select, update

from .engine import Store
from .schema import identities, identity_events

__all__ = [
    "NAME_PATTERN",
    "PROXY_PREFIX",
    "PROXY_USER_PATTERN",
    "IdentityEvent",
    "IdentityExists",
    "IdentityNotFound",
    "IdentityRow",
    "NewIdentity",
    "Role",
    "TokenRefusal",
    "Unusable",
    "check_token",
    "create_identity",
    "identities_mark",
    "identity_events_page",
    "list_identities",
    "proxy_identity",
    "revoke_identity",
    "touch_identity",
    "unusable_identities",
]

# What a token's identity may be called: no spaces, slashes or control characters (the
# name is in URLs, audit trails and command lines).
NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._@+-]{0,199}$"
# A user a trusted proxy names: the same rules, letters of any script kept as sent (an
# identity provider's names are not all ASCII); stored as ``proxy:<user>``.
PROXY_USER_PATTERN = r"^[^\W_][\w.@+-]{0,193}$"  # with the prefix, 200 at most
PROXY_PREFIX = "proxy:"
PREFIX = "sw_"
KEY_HEX = 16


class Role(StrEnum):
    """What an identity may do. Viewer, operator, admin: each may do what the ones before
    it may. A writer (a training job's token) records its own runs and nothing else; an
    admin may do what a writer may."""

    VIEWER = "viewer"  # every read, streams and exports
    OPERATOR = "operator"  # also control requests, the autopilot, alert rules
    ADMIN = "admin"  # also identities
    WRITER = "writer"  # creates runs, records into those it created, reads their requests

    def allows(self, needed: Role) -> bool:
        """Whether this role may do what ``needed`` may.

        >>> Role.OPERATOR.allows(Role.VIEWER), Role.VIEWER.allows(Role.OPERATOR)
        (True, False)
        >>> Role.WRITER.allows(Role.VIEWER), Role.ADMIN.allows(Role.WRITER)
        (False, True)
        """
        if self is needed or self is Role.ADMIN:
            return True
        if Role.WRITER in (self, needed):
            return False
        return _READ_ORDER.index(self) >= _READ_ORDER.index(needed)


_READ_ORDER = (Role.VIEWER, Role.OPERATOR, Role.ADMIN)


class TokenRefusal(StrEnum):
    """Why a presented token names nobody."""

    UNKNOWN = "unknown"
    REVOKED = "revoked"
    EXPIRED = "expired"


class IdentityExists(ValueError):
    def __init__(self, name: str) -> None:
        super().__init__(f"an identity named {name!r} exists already")
        self.name = name


class IdentityNotFound(LookupError):
    def __init__(self, name: str) -> None:
        super().__init__(f"no identity named {name!r}")
        self.name = name


@dataclass(frozen=True, kw_only=True)
class IdentityRow:
    """One identity, as it may be shown: never its token, salt or hash."""

    id: int
    name: str
    role: Role
    created_at: float
    created_by: str
    expires_at: float | None
    revoked_at: float | None
    last_used_at: float | None
    has_token: bool

    @classmethod
    def of(cls, row: RowMapping) -> IdentityRow:
        return cls(
            id=row["id"],
            name=row["name"],
            role=Role(row["role"]),
            created_at=row["created_at"],
            created_by=row["created_by"],
            expires_at=row["expires_at"],
            revoked_at=row["revoked_at"],
            last_used_at=row["last_used_at"],
            has_token=row["key"] is not None,
        )


@dataclass(frozen=True)
class NewIdentity:
    """An identity just made, with its token: the only time the token exists outside
    its holder."""

    identity: IdentityRow
    token: str


@dataclass(frozen=True, kw_only=True)
class IdentityEvent:
    id: int
    name: str
    action: str  # created | revoked
    role: Role
    by: str
    at: float


def _hash(salt: str, secret: str) -> str:
    return hashlib.sha256(bytes.fromhex(salt) + secret.encode()).hexdigest()


def _split(token: str) -> tuple[str, str] | None:
    """``sw_<key>_<secret>`` -> ``(key, secret)``; None for anything else."""
    if not token.startswith(PREFIX) or len(token) < len(PREFIX) + KEY_HEX + 2:
        return None
    key, sep, secret = token[len(PREFIX) :].partition("_")
    if sep != "_" or len(key) != KEY_HEX or not secret:
        return None
    return key, secret


def _by_name(conn: Connection, name: str) -> RowMapping | None:
    return conn.execute(select(identities).where(identities.c.name == name)).mappings().first()


def _audit(conn: Connection, name: str, action: str, role: Role, by: str, at: float) -> None:
    conn.execute(
        insert(identity_events).values(name=name, action=action, role=role.value, by=by, at=at)
    )


def create_identity(
    store: Store,
    name: str,
    role: Role,
    *,
    by: str,
    expires_at: float | None = None,
    now: float | None = None,
) -> NewIdentity:
    """A new identity with a new token (a revoked one of the same name is replaced).

    Raises :class:`IdentityExists` when ``name`` is in use, or ValueError for a name
    outside ``NAME_PATTERN``.
    """
    if not re.fullmatch(NAME_PATTERN, name):
        raise ValueError(
            f"{name!r} is no identity name: letters, digits and . _ @ + - (not first), 200 at most"
        )
    now = time.time() if now is None else now
    key, secret, salt = (
        secrets.token_hex(KEY_HEX // 2),
        secrets.token_urlsafe(32),
        secrets.token_hex(16),
    )
    values = {
        "role": Role(role).value,
        "key": key,
        "salt": salt,
        "token_hash": _hash(salt, secret),
        "created_at": now,
        "created_by": by,
        "expires_at": expires_at,
        "revoked_at": None,
        "last_used_at": None,
    }
    with store.write() as conn:
        old = _by_name(conn, name)
        if old is not None and old["revoked_at"] is None:
            raise IdentityExists(name)
        if old is None:
            conn.execute(insert(identities).values(name=name, **values))
        else:
            conn.execute(update(identities).where(identities.c.id == old["id"]).values(**values))
        _audit(conn, name, "created", Role(role), by, now)
        row = _by_name(conn, name)
    assert row is not None
    return NewIdentity(IdentityRow.of(row), f"{PREFIX}{key}_{secret}")


def list_identities(store: Store) -> list[IdentityRow]:
    with store.read() as conn:
        rows = conn.execute(select(identities).order_by(identities.c.name)).mappings()
        return [IdentityRow.of(row) for row in rows]


def revoke_identity(store: Store, name: str, *, by: str, now: float | None = None) -> IdentityRow:
    """Revoke ``name``'s token from now on (again: no change). Raises :class:`IdentityNotFound`."""
    now = time.time() if now is None else now
    with store.write() as conn:
        row = _by_name(conn, name)
        if row is None:
            raise IdentityNotFound(name)
        if row["revoked_at"] is None:
            conn.execute(
                update(identities).where(identities.c.id == row["id"]).values(revoked_at=now)
            )
            _audit(conn, name, "revoked", Role(row["role"]), by, now)
            row = _by_name(conn, name)
    assert row is not None
    return IdentityRow.of(row)


def check_token(
    store: Store, token: str, *, now: float | None = None
) -> IdentityRow | TokenRefusal:
    """The identity ``token`` names, or why it names nobody. The secret is compared in
    constant time (``hmac.compare_digest``)."""
    parts = _split(token)
    if parts is None:
        return TokenRefusal.UNKNOWN
    key, secret = parts
    with store.read() as conn:
        row = conn.execute(select(identities).where(identities.c.key == key)).mappings().first()
    if row is None or not hmac.compare_digest(_hash(row["salt"], secret), row["token_hash"]):
        return TokenRefusal.UNKNOWN
    now = time.time() if now is None else now
    if row["revoked_at"] is not None:
        return TokenRefusal.REVOKED
    if row["expires_at"] is not None and row["expires_at"] <= now:
        return TokenRefusal.EXPIRED
    return IdentityRow.of(row)


def touch_identity(store: Store, identity_id: int, at: float) -> None:
    """Record that the identity was used at ``at``."""
    with store.write() as conn:
        conn.execute(
            update(identities).where(identities.c.id == identity_id).values(last_used_at=at)
        )


def proxy_identity(
    store: Store, user: str, *, now: float | None = None
) -> IdentityRow | TokenRefusal:
    """The identity of the user a trusted proxy names: ``proxy:<user>``, a namespace of its
    own (a token's name holds no colon), made a viewer on first sight (audited as made by
    ``proxy``). The proxy's role header applies to its request only: the record's role is
    never changed through the proxy. A revoked one stays refused.

    Raises ValueError for a user outside ``PROXY_USER_PATTERN``.
    """
    if not re.fullmatch(PROXY_USER_PATTERN, user):
        raise ValueError(
            f"{user[:40]!r} is no user name: letters, digits and . _ @ + - (not first), 194 at most"
        )
    name = f"{PROXY_PREFIX}{user}"
    now = time.time() if now is None else now
    with store.read() as conn:
        row = _by_name(conn, name)
    if row is None:
        with store.write() as conn:
            row = _by_name(conn, name)
            if row is None:
                conn.execute(
                    insert(identities).values(
                        name=name, role=Role.VIEWER.value, created_at=now, created_by="proxy"
                    )
                )
                _audit(conn, name, "created", Role.VIEWER, "proxy", now)
                row = _by_name(conn, name)
    assert row is not None
    if row["revoked_at"] is not None:
        return TokenRefusal.REVOKED
    return IdentityRow.of(row)


@dataclass(frozen=True)
class Unusable:
    """The identities that may no longer be used, as of the audit event ``mark``: revoked
    (by name), and those with an expiry (by name, when)."""

    mark: int
    revoked: frozenset[str]
    expiring: dict[str, float]


def identities_mark(store: Store) -> int:
    """The newest event of the identities' audit trail (0: none): it moves with every
    creation and revocation, by this process or any other."""
    with store.read() as conn:
        return int(conn.execute(select(func.max(identity_events.c.id))).scalar() or 0)


def unusable_identities(store: Store) -> Unusable:
    with store.read() as conn:
        mark = int(conn.execute(select(func.max(identity_events.c.id))).scalar() or 0)
        rows = conn.execute(
            select(identities.c.name, identities.c.revoked_at, identities.c.expires_at).where(
                identities.c.revoked_at.is_not(None) | identities.c.expires_at.is_not(None)
            )
        ).all()
    return Unusable(
        mark=mark,
        revoked=frozenset(name for name, revoked, _ in rows if revoked is not None),
        expiring={name: expires for name, revoked, expires in rows if revoked is None and expires},
    )


def identity_events_page(store: Store, limit: int = 100) -> list[IdentityEvent]:
    """The newest ``limit`` events of the identities' audit trail, oldest first."""
    with store.read() as conn:
        rows = conn.execute(
            select(identity_events).order_by(identity_events.c.id.desc()).limit(limit)
        ).mappings()
        events = [
            IdentityEvent(
                id=r["id"],
                name=r["name"],
                action=r["action"],
                role=Role(r["role"]),
                by=r["by"],
                at=r["at"],
            )
            for r in rows
        ]
    return events[::-1]
