"""Dependencies shared by the routes, declared once as ``Annotated`` aliases."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Header, HTTPException, Request, status

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


def require_token(
    settings: Annotated[Settings, Depends(app_settings)],
    authorization: Annotated[str | None, Header(include_in_schema=False)] = None,
) -> None:
    expected = settings.token.get_secret_value() if settings.token is not None else None
    if not check_token(authorization, expected):
        raise HTTPException(
            status.HTTP_401_UNAUTHORIZED,
            detail="a valid 'Authorization: Bearer <token>' header is required",
            headers={"WWW-Authenticate": "Bearer"},
        )


SettingsDep = Annotated[Settings, Depends(app_settings)]
StoreDep = Annotated[Store, Depends(get_store)]
TokenDep = Annotated[None, Depends(require_token)]
