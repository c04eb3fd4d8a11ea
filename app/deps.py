"""Dependencies shared by the routes, declared once as ``Annotated`` aliases."""

from __future__ import annotations

import math
from typing import Annotated

from fastapi import Depends, Header, HTTPException, Request, Security, status
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from app.penalty import FailurePenalty
from app.security import check_token
from app.settings import Settings
from scaler.store.engine import Store

__all__ = ["SettingsDep", "StoreDep", "TokenDep", "app_settings", "get_store", "require_token"]


def app_settings(request: Request) -> Settings:
    """The settings the app was built with (``create_app``)."""
    settings: Settings = request.app.state.settings
    return settings


def get_store(request: Request) -> Store:
    store: Store = request.app.state.store
    return store


# Declares the bearer scheme in the OpenAPI document (Swagger UI's "Authorize"); the
# check itself is require_token's, which answers 401 as it should, not HTTPBearer's 403.
_BEARER = HTTPBearer(auto_error=False, description="the token `scalewatch serve` printed")


def require_token(
    request: Request,
    settings: Annotated[Settings, Depends(app_settings)],
    _scheme: Annotated[HTTPAuthorizationCredentials | None, Security(_BEARER)] = None,
    authorization: Annotated[str | None, Header(include_in_schema=False)] = None,
) -> None:
    """401 for a missing or wrong bearer token; 429, whatever the token, for a client
    locked out by its wrong tokens (``app.state.penalty``)."""
    penalty: FailurePenalty = request.app.state.penalty
    client = request.client.host if request.client else "unknown"
    locked = penalty.locked_for(client)
    if locked > 0:
        raise HTTPException(
            status.HTTP_429_TOO_MANY_REQUESTS,
            detail=f"too many wrong tokens from {client}: try again in {math.ceil(locked)} s",
            headers={"Retry-After": str(math.ceil(locked))},
        )
    expected = settings.token.get_secret_value() if settings.token is not None else None
    if not check_token(authorization, expected):
        penalty.failed(client)
        raise HTTPException(
            status.HTTP_401_UNAUTHORIZED,
            detail="a valid 'Authorization: Bearer <token>' header is required",
            headers={"WWW-Authenticate": "Bearer"},
        )
    penalty.succeeded(client)


SettingsDep = Annotated[Settings, Depends(app_settings)]
StoreDep = Annotated[Store, Depends(get_store)]
TokenDep = Annotated[None, Depends(require_token)]
