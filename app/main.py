"""Builds the FastAPI application; ``scalewatch serve`` runs it."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import anyio
from fastapi import FastAPI

from app.alerts.config import AlertConfig, default_rules, load_rules
from app.alerts.service import watching
from app.autopilot import AutopilotLoop, run_loop
from app.dashboard import mount_dashboard
from app.docs import install_docs
from app.errors import install_error_handlers
from app.live.hubs import Hubs, Pacing
from app.middleware.access import Access, reads_open
from app.middleware.head import HeadAsGet
from app.middleware.headers import SecurityHeaders
from app.middleware.health import StorageGuard, StoreHealth
from app.middleware.identity import KnownTokens, Tickets, UsageClock
from app.middleware.limits import BodyLimit
from app.middleware.penalty import FailurePenalty
from app.middleware.roles import undeclared
from app.middleware.security import LoopbackHost, is_loopback
from app.openapi import install_openapi
from app.routes import router
from app.routes.metrics import metrics_registry
from app.services import Services
from app.settings import Settings, get_settings
from scaler.store.engine import open_store

__all__ = ["CHART_THREADS", "create_app"]

# Chart queries that run at once, by the store's dialect; the others wait their turn.
# SQLite's run in the service's own process, beside the live streams; PostgreSQL's in
# the server's, while the service's thread only waits.
CHART_THREADS = {"sqlite": 4, "postgresql": 16}


def create_app(
    settings: Settings | None = None,
    alerts: AlertConfig | None = None,
    *,
    penalty: FailurePenalty | None = None,
) -> FastAPI:
    """The service over the store at ``settings.db`` (default: ``get_settings()``), with
    the alert rules ``alerts`` (default: the file ``settings.alerts``, else the default
    rules). ``penalty``: the lockout of clients whose tokens are wrong (default:
    :class:`~app.middleware.penalty.FailurePenalty`'s).

    Every route needs the role :mod:`app.middleware.roles` gives it
    (:mod:`app.middleware.access`): a route without one makes this raise RuntimeError. A
    rules file that cannot be used raises :class:`app.alerts.RulesFileError` here.
    """
    settings = settings if settings is not None else get_settings()
    if alerts is None:
        alerts = (
            load_rules(settings.alerts)
            if settings.alerts is not None
            else AlertConfig(default_rules())
        )
    config = alerts

    health, tickets = StoreHealth(), Tickets()
    known_tokens = KnownTokens(UsageClock())
    penalty = penalty if penalty is not None else FailurePenalty()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        store = open_store(settings.db)
        autopilot = AutopilotLoop(store, rules=config.autopilots)
        hubs = Hubs(store, Pacing.of(settings))
        try:
            async with (
                watching(store, config, settings.alerts_interval_s) as watched,
                anyio.create_task_group() as tasks,
            ):
                app.state.services = Services(
                    store=store,
                    chart_limiter=anyio.CapacityLimiter(CHART_THREADS[store.engine.dialect.name]),
                    hubs=hubs,
                    alerts=watched,
                    metrics=metrics_registry(store, watched.sender),
                    autopilot=autopilot,
                    health=health,
                    penalty=penalty,
                    tickets=tickets,
                    known_tokens=known_tokens,
                    reads_open=reads_open(settings),
                )
                tasks.start_soon(run_loop, autopilot, settings.autopilot_interval_s)
                yield
                tasks.cancel_scope.cancel()
        finally:
            hubs.close()
            store.close()

    app = FastAPI(
        title="scalewatch",
        summary="Loss-scale telemetry and runtime control of fp16 training runs",
        version="0.1.0",
        lifespan=lifespan,
        docs_url=None,  # install_docs: served from an installed package, not a CDN
        redoc_url=None,
    )
    app.state.settings = settings  # what the routes' SettingsDep gives
    install_error_handlers(app)
    app.add_middleware(BodyLimit)
    app.add_middleware(Access, settings=settings)  # before the body
    app.add_middleware(HeadAsGet)
    if is_loopback(settings.host):
        app.add_middleware(LoopbackHost, allowed=settings.allowed_hosts)
    app.add_middleware(StorageGuard)
    app.add_middleware(SecurityHeaders)  # outermost: on every refusal too
    app.include_router(router)
    install_docs(app)
    install_openapi(app)
    mount_dashboard(app)
    if missing := undeclared(app.openapi()):
        raise RuntimeError(f"routes without a role in app.middleware.roles: {', '.join(missing)}")
    return app
