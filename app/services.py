"""The services of one app, typed, in one object.

The app's lifespan (:func:`scalewatch.app.main.create_app`) builds a :class:`Services` in the event
loop's thread and holds it on ``app.state.services`` while the app serves; routes reach
it through :data:`scalewatch.app.deps.ServicesDep`, middleware through :func:`services_of`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

# Types alone: the middleware that reaches its services here is imported by them.
if TYPE_CHECKING:
    import anyio
    from prometheus_client import CollectorRegistry
    from starlette.applications import Starlette

    from scalewatch.store.chart_cache import ChartCache
    from scalewatch.store.engine import Store

    from .alerts.service import Alerts
    from .autopilot.loop import AutopilotLoop
    from .ingest import RunBatches
    from .live.hubs import Hubs
    from .middleware.health import StoreHealth
    from .middleware.identity import KnownTokens, Tickets
    from .middleware.penalty import FailurePenalty
    from .middleware.revocations import Revocations

__all__ = ["Services", "services_of"]


@dataclass(kw_only=True)
class Services:
    """What the routes and the middleware of a serving app share.

    ``health``, ``penalty``, ``tickets``, ``known_tokens`` and ``revocations`` are the
    app's, made once in ``create_app``; the others are opened by each start of its
    lifespan and closed by its end.
    """

    store: Store
    chart_limiter: anyio.CapacityLimiter  # chart queries that run at once
    charts: ChartCache  # chart buckets that can no longer change, read once
    hubs: Hubs  # the live streams' pollers
    alerts: Alerts  # the evaluator and the webhook sender
    metrics: CollectorRegistry  # what /metrics serves
    autopilot: AutopilotLoop
    health: StoreHealth  # the last storage failure a request met
    penalty: FailurePenalty  # wrong tokens per client
    tickets: Tickets  # the streams' and exports' tickets
    known_tokens: KnownTokens  # tokens checked in the last few seconds
    revocations: Revocations  # identities no longer usable: open streams and tickets end
    batches: RunBatches  # jobs' batches being stored: one of a run at a time
    reads_open: bool  # anonymous reads allowed (loopback unless --private-read, or --public-read)


def services_of(app: Starlette) -> Services:
    """The services of ``app`` while it serves (its lifespan has started)."""
    services: Services = app.state.services
    return services
