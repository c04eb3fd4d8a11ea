"""Webhook delivery: a JSON POST per alert change, off the service's path.

Each webhook has its own thread and bounded queue: a receiver that hangs or fails delays
only its own deliveries, and a full queue drops the newest (counted, logged once a
streak) rather than grow. A delivery is retried with exponential backoff on a connection
error, a timeout, a 5xx or a 429; another 4xx is the receiver's final word.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import httpx

from scalewatch.store.alerts import AlertRow

from .config import Webhook
from .text import alert_text, said

__all__ = ["QUEUE_SIZE", "Delivery", "WebhookSender", "payload"]

log = logging.getLogger("scalewatch.app.alerts")

QUEUE_SIZE = 1000  # deliveries waiting per webhook at most


def payload(alert: AlertRow) -> dict[str, Any]:
    """The JSON body of a webhook for the alert as it is now (firing or resolved)."""
    return {
        "rule": alert.rule,
        "kind": alert.kind,
        "state": str(alert.state),
        "run": {"id": alert.run_id, "name": alert.run_name},
        "step": alert.step,
        "value": alert.current_value,
        "threshold": alert.threshold,
        "text": alert_text(alert),
        "says": said(alert.kind, alert.value, alert.threshold, alert.detail),
        "detail": alert.detail,
        "alert_id": alert.id,
        "fired_step": alert.fired_step,
        "fired_at": alert.fired_at,
        "resolved_step": alert.resolved_step,
        "resolved_at": alert.resolved_at,
    }


@dataclass(frozen=True)
class Delivery:
    """What became of one POST: ``delivered``, ``failed`` (retries spent, or a 4xx)."""

    url: str
    alert_id: int
    state: str
    outcome: str
    attempts: int


class _Hook:
    def __init__(self, hook: Webhook, sender: WebhookSender) -> None:
        self.hook = hook
        self.sender = sender
        self.queue: queue.Queue[dict[str, Any]] = queue.Queue(maxsize=sender.queue_size)
        self.thread = threading.Thread(
            target=self._run, name=f"scalewatch-webhook-{hook.url.host}", daemon=True
        )

    def _run(self) -> None:
        with httpx.Client(timeout=self.hook.timeout_s, follow_redirects=False) as client:
            while not self.sender.stopping.is_set():
                try:
                    body = self.queue.get(timeout=0.2)
                except queue.Empty:
                    continue
                self.sender.finished(self._deliver(client, body))

    def _deliver(self, client: httpx.Client, body: dict[str, Any]) -> Delivery:
        url = str(self.hook.url)
        delay = self.sender.backoff_s
        for attempt in range(1, self.sender.attempts + 1):
            retry = False
            try:
                response = client.post(url, json=body)
                if response.is_success:
                    return Delivery(url, body["alert_id"], body["state"], "delivered", attempt)
                retry = response.status_code >= 500 or response.status_code == 429
                problem = f"HTTP {response.status_code}"
            except httpx.HTTPError as error:
                retry = True
                problem = f"{type(error).__name__}: {error}" if str(error) else type(error).__name__
            if not retry or attempt == self.sender.attempts:
                break
            if self.sender.stopping.wait(delay):
                break
            delay = min(delay * 2, self.sender.max_backoff_s)
        log.warning(
            "scalewatch: webhook %s: alert %s (%s) not delivered after %d attempts: %s",
            self.hook.url.host, body["alert_id"], body["state"], attempt, problem,
        )  # fmt: skip
        return Delivery(url, body["alert_id"], body["state"], "failed", attempt)


class WebhookSender:
    """Sends every alert change to every webhook; :meth:`send` never waits."""

    def __init__(
        self,
        hooks: Sequence[Webhook],
        *,
        attempts: int = 5,
        backoff_s: float = 1.0,
        max_backoff_s: float = 30.0,
        queue_size: int = QUEUE_SIZE,
    ) -> None:
        self.attempts, self.backoff_s, self.max_backoff_s = attempts, backoff_s, max_backoff_s
        self.queue_size = queue_size
        self.stopping = threading.Event()
        self.counts: dict[str, int] = {"delivered": 0, "failed": 0, "dropped": 0}
        self.deliveries: list[Delivery] = []  # the latest ones, for tests and metrics
        self._lock = threading.Lock()
        self._hooks = [_Hook(hook, self) for hook in hooks]

    def start(self) -> WebhookSender:
        for hook in self._hooks:
            hook.thread.start()
        return self

    def send(self, alert: AlertRow) -> None:
        body = payload(alert)
        for hook in self._hooks:
            try:
                hook.queue.put_nowait(body)
            except queue.Full:
                with self._lock:
                    self.counts["dropped"] += 1
                    first = self.counts["dropped"] == 1
                if first:
                    log.warning(
                        "scalewatch: webhook %s is %d deliveries behind: dropping new ones",
                        hook.hook.url.host, self.queue_size,
                    )  # fmt: skip

    def finished(self, delivery: Delivery) -> None:
        with self._lock:
            self.counts[delivery.outcome] += 1
            self.deliveries = [*self.deliveries[-99:], delivery]

    def close(self, timeout_s: float = 1.0) -> None:
        """Stop the threads (what is still queued is not sent)."""
        self.stopping.set()
        for hook in self._hooks:
            if hook.thread.is_alive():
                hook.thread.join(timeout_s)
