"""Dependencies shared by the routes, declared once as ``Annotated`` aliases.

Each is ``async``, though none awaits: FastAPI calls a plain ``def`` dependency in its
thread pool, a hop there and back for every request and every dependency (two for a
job's batch, besides the route's own), where these only read attributes."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, HTTPException, Request, Security, status
from fastapi.security import HTTPBearer

from scalewatch.store.engine import Store

from .middleware.identity import Identity
from .services import Services, services_of
from .settings import Settings

__all__ = [
    "ActorDep",
    "ServicesDep",
    "SettingsDep",
    "StoreDep",
    "app_services",
    "app_settings",
    "get_store",
    "who",
]


async def app_settings(request: Request) -> Settings:
    """The settings the app was built with (``create_app``)."""
    settings: Settings = request.app.state.settings
    return settings


async def app_services(request: Request) -> Services:
    """The services of the serving app (:mod:`scalewatch.app.services`)."""
    return services_of(request.app)


ServicesDep = Annotated[Services, Depends(app_services)]


async def get_store(services: ServicesDep) -> Store:
    """The store of the serving app: the service most routes need alone."""
    return services.store


# Declares the bearer scheme in the OpenAPI document (Swagger UI's "Authorize"); the
# check itself is scalewatch.app.middleware.access's, before the route runs.
_BEARER = HTTPBearer(auto_error=False, description="a token of `scalewatch tokens create`")


async def who(request: Request, _scheme: Annotated[object, Security(_BEARER)] = None) -> Identity:
    """The identity scalewatch.app.middleware.access let through to a route that needs one."""
    identity: Identity | None = getattr(request.state, "identity", None)
    if identity is None:  # a route that needs a role is never reached anonymously
        raise HTTPException(status.HTTP_401_UNAUTHORIZED, "a bearer token is required")
    return identity


SettingsDep = Annotated[Settings, Depends(app_settings)]
StoreDep = Annotated[Store, Depends(get_store)]
ActorDep = Annotated[Identity, Depends(who)]
