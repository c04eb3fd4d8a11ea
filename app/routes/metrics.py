"""Prometheus metrics, read from the store at each scrape, and the health check."""

from __future__ import annotations

import re
from collections.abc import Iterator

from fastapi import APIRouter, Response, status
from fastapi.responses import JSONResponse
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from scalewatch.store import queries
from scalewatch.store.alerts import firing_alerts
from scalewatch.store.engine import Store
from scalewatch.store.errors import storage_failure
from scalewatch.store.states import RunStatus

from ..alerts.webhooks import WebhookSender
from ..deps import ServicesDep, StoreDep
from ..models import Health, Unhealthy

router = APIRouter(tags=["metrics"])

LABELS = ["run_id", "run_name"]
# C0, DEL and C1: prometheus_client escapes only backslash, newline and double quote, and a
# run's name is whatever its trainer called it (a terminal escape reaches whoever reads it).
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f]")


def label_value(text: str) -> str:
    r"""``text`` with each control character written as ``\uXXXX``.

    >>> print(label_value("gpt\x1b[2J\r\tx\x7f\n"))
    gpt\u001b[2J\u000d\u0009x\u007f\u000a
    """
    return _CONTROL.sub(lambda match: f"\\u{ord(match.group()):04x}", text)


class StoreCollector(Collector):
    """One sample per run and metric, labelled by run id and name."""

    def __init__(self, store: Store) -> None:
        self.store = store

    def collect(self) -> Iterator[Metric]:
        scale = GaugeMetricFamily("scalewatch_scale", "Current loss scale", labels=LABELS)
        tracker = GaugeMetricFamily(
            "scalewatch_growth_tracker",
            "Clean steps since the last growth or backoff",
            labels=LABELS,
        )
        running = GaugeMetricFamily(
            "scalewatch_run_running", "1 while the run is running", labels=LABELS
        )
        steps = CounterMetricFamily("scalewatch_steps", "Steps reached", labels=LABELS)
        overflows = CounterMetricFamily(
            "scalewatch_overflows", "Steps with inf/NaN gradients", labels=LABELS
        )
        skipped = CounterMetricFamily(
            "scalewatch_skipped_steps", "Optimizer steps skipped", labels=LABELS
        )
        drift = GaugeMetricFamily(
            "scalewatch_schedule_drift",
            "Skipped steps a registered LR scheduler stepped on: its lead over the weights",
            labels=LABELS,
        )
        grad_norm = GaugeMetricFamily(
            "scalewatch_grad_norm",
            "Total L2 norm of the unscaled gradients at the last recorded step",
            labels=LABELS,
        )
        for run in queries.list_runs(self.store):
            labels = [str(run.id), label_value(run.name)]
            if run.scale is not None:
                scale.add_metric(labels, run.scale)
            if run.growth_tracker is not None:
                tracker.add_metric(labels, run.growth_tracker)
            if run.schedule_drift is not None:
                drift.add_metric(labels, run.schedule_drift)
            if run.grad_norm is not None:
                grad_norm.add_metric(labels, run.grad_norm)
            running.add_metric(labels, 1.0 if run.status is RunStatus.RUNNING else 0.0)
            steps.add_metric(labels, run.steps)
            overflows.add_metric(labels, run.overflows)
            skipped.add_metric(labels, run.skipped)
        firing = GaugeMetricFamily(
            "scalewatch_alert_firing",
            "1 while the rule's alert on the run is firing (no sample otherwise)",
            labels=[*LABELS, "rule"],
        )
        for alert in firing_alerts(self.store):
            labels = [str(alert.run_id), label_value(alert.run_name), label_value(alert.rule)]
            firing.add_metric(labels, 1.0)
        yield from (scale, tracker, drift, grad_norm, running, steps, overflows, skipped, firing)


class WebhookCollector(Collector):
    """The webhook deliveries of this service process, by outcome."""

    def __init__(self, sender: WebhookSender) -> None:
        self.sender = sender

    def collect(self) -> Iterator[Metric]:
        deliveries = CounterMetricFamily(
            "scalewatch_webhook_deliveries",
            "Alert webhook POSTs: delivered, failed (retries spent or refused), dropped"
            " (queue full)",
            labels=["outcome"],
        )
        for outcome, count in sorted(self.sender.counts.items()):
            deliveries.add_metric([outcome], count)
        yield deliveries


def metrics_registry(store: Store, sender: WebhookSender | None = None) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(StoreCollector(store))
    if sender is not None:
        registry.register(WebhookCollector(sender))
    return registry


@router.get("/metrics", response_class=Response, responses={200: {"content": {"text/plain": {}}}})
def metrics(services: ServicesDep) -> Response:
    return Response(generate_latest(services.metrics), media_type=CONTENT_TYPE_LATEST)


@router.get(
    "/healthz",
    response_model=Health,
    responses={
        503: {"model": Unhealthy, "description": "the store cannot be used (damaged, unreadable)"}
    },
)
def healthz(services: ServicesDep, store: StoreDep) -> Health | JSONResponse:
    """ok when a probe of the store reads and (SQLite) no request met a storage failure
    lately."""
    health = services.health
    # SQLite's damaged pages, met by a request, may be missed by the probe: remembered for
    # a while. A server's failures (down, unreachable) are its state, which a probe sees,
    # so on PostgreSQL /healthz is ok again as soon as the server is back.
    problem = health.problem() if store.engine.dialect.name == "sqlite" else None
    if problem is None:
        try:
            store.probe()
        except Exception as error:
            problem = storage_failure(error)
            if problem is None:
                raise
            health.failed(problem)
    if problem is None:
        return Health()
    body = Unhealthy(detail=f"the store cannot be used: {problem}")
    return JSONResponse(body.model_dump(), status.HTTP_503_SERVICE_UNAVAILABLE)
