"""Builds the FastAPI application; ``scalewatch serve`` runs it."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import anyio
from fastapi import FastAPI

from scalewatch.store.chart_cache import ChartCache
from scalewatch.store.engine import open_store

from .alerts.config import AlertConfig, default_rules, load_rules
from .alerts.service import watching
from .autopilot import AutopilotLoop, run_loop
from .dashboard import mount_dashboard
from .docs import install_docs
from .errors import install_error_handlers
from .ingest import STORING_THREADS, RunBatches
from .live.hubs import Hubs, Pacing
from .middleware.access import Access, reads_open
from .middleware.clients import ClientCap
from .middleware.forwarded import ClientAddress
from .middleware.head import HeadAsGet
from .middleware.headers import SecurityHeaders
from .middleware.health import StorageGuard, StoreHealth
from .middleware.hosts import LoopbackHost, is_loopback
from .middleware.identity import KnownTokens, Tickets, UsageClock
from .middleware.limits import BodyLimit
from .middleware.penalty import FailurePenalty
from .middleware.revocations import Revocations
from .middleware.roles import undeclared
from .openapi import install_openapi
from .routes import router
from .routes.metrics import metrics_registry
from .services import Services
from .settings import Settings, get_settings

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
    :class:`~scalewatch.app.middleware.penalty.FailurePenalty`'s).

    Every route needs the role :mod:`scalewatch.app.middleware.roles` gives it
    (:mod:`scalewatch.app.middleware.access`): a route without one makes this raise RuntimeError. A
    rules file that cannot be used raises :class:`scalewatch.app.alerts.RulesFileError` here.
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
    revocations = Revocations(known_tokens)
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
                    charts=ChartCache(),
                    hubs=hubs,
                    alerts=watched,
                    metrics=metrics_registry(store, watched.sender),
                    autopilot=autopilot,
                    health=health,
                    penalty=penalty,
                    tickets=tickets,
                    known_tokens=known_tokens,
                    revocations=revocations,
                    batches=RunBatches(
                        STORING_THREADS[store.engine.dialect.name],
                        hubs.appends,
                        watched.evaluator.offer,
                    ),
                    reads_open=reads_open(settings),
                )
                tasks.start_soon(run_loop, autopilot, settings.autopilot_interval_s)
                tasks.start_soon(revocations.watch, store, hubs.wake)
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
    app.add_middleware(BodyLimit, timeout_s=settings.body_timeout_s)
    app.add_middleware(ClientCap, max_requests=settings.max_requests_per_client)
    app.add_middleware(Access, settings=settings)  # before the body
    app.add_middleware(HeadAsGet)
    if is_loopback(settings.host) and settings.uds is None:  # no browser reaches a unix socket
        app.add_middleware(LoopbackHost, allowed=settings.allowed_hosts)
    app.add_middleware(StorageGuard)
    app.add_middleware(SecurityHeaders)  # on every refusal too
    # Outermost: who the client is, before anything counts or logs it.
    app.add_middleware(
        ClientAddress,
        trust_proxy=settings.trust_proxy,
        unix_is_proxy=settings.uds is not None and settings.proxy_user_header is not None,
    )
    app.include_router(router)
    install_docs(app)
    install_openapi(app)
    mount_dashboard(app)
    if missing := undeclared(app.openapi()):
        raise RuntimeError(
            f"routes without a role in scalewatch.app.middleware.roles: {', '.join(missing)}"
        )
    return app
