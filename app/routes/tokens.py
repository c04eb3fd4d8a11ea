"""Identities and their tokens (an admin's), who a request comes from, and stream tickets."""

from __future__ import annotations

import time
from typing import Annotated, Literal

import anyio
from fastapi import APIRouter, HTTPException, Path, Request, status
from pydantic import BaseModel, Field

from scalewatch.store.identities import (
    NAME_PATTERN,
    IdentityExists,
    IdentityNotFound,
    IdentityRow,
    Role,
    create_identity,
    list_identities,
    revoke_identity,
)

from ..deps import ActorDep, ServicesDep, StoreDep
from ..middleware.identity import DURATION_PATTERN, TICKET_S, Identity, parse_duration
from ..models import ErrorMessage
from .write_responses import WRITE_RESPONSES

__all__ = ["IdentityOut", "NewToken", "TokenRequest", "WhoAmI", "router"]

router = APIRouter(prefix="/api", tags=["identities"])

Name = Annotated[str, Field(pattern=NAME_PATTERN)]


class TokenRequest(BaseModel):
    """A new identity: ``{"name": "ada", "role": "operator", "expires": "30d"}``."""

    name: Name
    role: Role
    expires: str | None = Field(
        default=None, pattern=DURATION_PATTERN, description="30d, 12h, 45m, 90s, 2w; none: never"
    )


class IdentityOut(BaseModel):
    """An identity as it is shown: never a token or its hash."""

    name: str
    role: Role
    kind: Literal["token", "proxy"]
    created_at: float
    created_by: str
    expires_at: float | None
    revoked_at: float | None
    last_used_at: float | None

    @classmethod
    def of(cls, row: IdentityRow) -> IdentityOut:
        return cls(
            name=row.name,
            role=row.role,
            kind="token" if row.has_token else "proxy",
            created_at=row.created_at,
            created_by=row.created_by,
            expires_at=row.expires_at,
            revoked_at=row.revoked_at,
            last_used_at=row.last_used_at,
        )


class NewToken(BaseModel):
    """The identity made, and its token: shown this once, kept nowhere by the service."""

    identity: IdentityOut
    token: str


class WhoAmI(BaseModel):
    """Who the service takes the request for (``name`` null: an anonymous read)."""

    name: str | None
    role: Role | None
    source: str
    reads_open: bool


class Ticket(BaseModel):
    """A stream ticket: ``?ticket=`` on a stream or an export, for ``expires_in`` seconds."""

    ticket: str
    expires_in: float


ANONYMOUS = "anonymous"
NO_IDENTITY: dict[int | str, dict[str, object]] = {
    404: {"model": ErrorMessage, "description": "no identity of this name"}
}


@router.get("/whoami")
def whoami(request: Request, services: ServicesDep) -> WhoAmI:
    identity: Identity | None = getattr(request.state, "identity", None)
    reads_open = services.reads_open
    if identity is None:
        return WhoAmI(name=None, role=None, source="anonymous", reads_open=reads_open)
    return WhoAmI(
        name=identity.name, role=identity.role, source=identity.source, reads_open=reads_open
    )


@router.post("/tickets")
def ticket(request: Request, services: ServicesDep) -> Ticket:
    """A ticket for the streams and exports of who asks (an anonymous viewer where reads
    are open: the dashboard asks alike either way)."""
    identity: Identity | None = getattr(request.state, "identity", None)
    holder = identity or Identity(ANONYMOUS, Role.VIEWER, "anonymous", revocable=False)
    return Ticket(ticket=services.tickets.issue(holder), expires_in=TICKET_S)


@router.get("/tokens")
def tokens(store: StoreDep, _actor: ActorDep) -> list[IdentityOut]:
    return [IdentityOut.of(row) for row in list_identities(store)]


@router.post(
    "/tokens",
    status_code=status.HTTP_201_CREATED,
    responses={
        **{code: answer for code, answer in WRITE_RESPONSES.items() if code != 404},
        409: {"model": ErrorMessage, "description": "the name is in use"},
    },
)
def new_token(store: StoreDep, actor: ActorDep, body: TokenRequest) -> NewToken:
    expires_at = time.time() + parse_duration(body.expires) if body.expires else None
    try:
        made = create_identity(store, body.name, body.role, by=actor.name, expires_at=expires_at)
    except IdentityExists as refused:
        raise HTTPException(status.HTTP_409_CONFLICT, str(refused)) from None
    return NewToken(identity=IdentityOut.of(made.identity), token=made.token)


@router.delete("/tokens/{name}", responses=NO_IDENTITY)
def revoke(
    store: StoreDep, services: ServicesDep, actor: ActorDep, name: Annotated[str, Path()]
) -> IdentityOut:
    try:
        revoked = revoke_identity(store, name, by=actor.name)
    except IdentityNotFound as missing:
        raise HTTPException(status.HTTP_404_NOT_FOUND, str(missing)) from None
    services.known_tokens.forget()  # refused from the next request on
    if services.revocations.load(store):  # its streams end now, its tickets fail
        anyio.from_thread.run_sync(services.hubs.wake)
    return IdentityOut.of(revoked)
