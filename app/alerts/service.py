"""The alerts of a running service: the evaluator's loop and the webhook threads."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import anyio

from scalewatch.store.engine import Store
from scalewatch.store.errors import storage_failure

from .config import AlertConfig
from .evaluate import Evaluator
from .webhooks import WebhookSender

__all__ = ["Alerts", "watching"]

log = logging.getLogger("scalewatch.app.alerts")


class Alerts:
    """The service's evaluator and webhook sender (``Services.alerts``)."""

    def __init__(self, store: Store, config: AlertConfig) -> None:
        self.config = config
        self.sender = WebhookSender(config.webhooks)
        self.evaluator = Evaluator(store, config.rules, on_change=self.sender.send)
        self.ticks = 0  # rounds done, for tests that wait for one
        self._failing = False

    def tick(self) -> None:
        """One round; a failure is logged (once while it lasts) and the next round tries again."""
        try:
            self.evaluator.tick()
        except Exception as error:
            if storage_failure(error) is None and not isinstance(error, OSError):
                log.exception("scalewatch: evaluating alerts failed")
            elif not self._failing:
                log.warning("scalewatch: alerts not evaluated: %s", storage_failure(error) or error)
            self._failing = True
        else:
            self._failing = False
        self.ticks += 1


@asynccontextmanager
async def watching(store: Store, config: AlertConfig, interval_s: float) -> AsyncIterator[Alerts]:
    """Evaluate every ``interval_s`` seconds (in a worker thread) while the block runs."""
    alerts = Alerts(store, config)
    alerts.sender.start()

    async def loop() -> None:
        while True:
            await anyio.to_thread.run_sync(alerts.tick)
            await anyio.sleep(interval_s)

    try:
        async with anyio.create_task_group() as group:
            group.start_soon(loop)
            try:
                yield alerts
            finally:
                group.cancel_scope.cancel()
    finally:
        alerts.sender.close()
