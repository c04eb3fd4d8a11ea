"""``StepTap``: a mirror that keeps the steps for a trainer's callback to log.

Its ``write`` runs on the mirror's own thread (``scalewatch.mirrors._feed``); the callback
takes the steps on the training thread, where a trainer's loggers are called.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from typing import Any

from ..mirrors import Mirror, MirroredStep, RunLinks

log = logging.getLogger("scalewatch.integrations")


class StepTap(Mirror):
    """The steps its scaler's run recorded, until a callback takes them."""

    name = "trainer-logs"
    interval_s = 0.1  # no tracker behind it: a batch costs a lock

    def __init__(self) -> None:
        super().__init__()
        self._steps: deque[MirroredStep] = deque()
        self._arrived = threading.Condition()
        self.last: MirroredStep | None = None  # the latest step written, taken or not
        self.attached = False

    def attach(self) -> None:
        self.attached = True  # on the reporting rank, whose run's steps it will get

    def write(self, steps: list[MirroredStep]) -> None:
        with self._arrived:
            self._steps.extend(steps)
            self.last = steps[-1]
            self._arrived.notify_all()

    def describe(self, links: RunLinks) -> None:
        pass

    def _has(self, step: int) -> bool:
        return self.last is not None and self.last.step >= step

    def take(self, until: int | None = None, timeout: float = 5.0) -> list[MirroredStep]:
        """The steps written since the last call; with ``until``, first waits (up to
        ``timeout``) for the step of that number to be written, on the reporting rank (no
        other rank's tap gets a step)."""
        deadline = time.monotonic() + timeout
        with self._arrived:
            while until is not None and self.attached and not self._has(until):
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._arrived.wait(left)
            steps = list(self._steps)
            self._steps.clear()
        return steps


def tap(scaler: Any, trainer: str, had: StepTap | None = None) -> StepTap | None:
    """A tap added to ``scaler`` (the one the trainer steps with), or None, said once, when
    it is not scalewatch's or records nothing. ``had``: the callback's tap of an earlier
    fit, kept if the scaler has it still."""
    from ..grad_scaler import GradScaler
    from ..sharded import ShardedGradScaler

    if not isinstance(scaler, GradScaler | ShardedGradScaler):
        log.warning(
            "scalewatch: %s steps with no scalewatch scaler (%s); its loggers get no loss scale",
            trainer,
            type(scaler).__name__,
        )
        return None
    if not scaler.is_enabled():
        return None
    if had is not None and any(mirror is had for mirror in scaler.mirrors):
        return had
    step_tap = StepTap()
    try:
        scaler.add_mirror(step_tap)
    except ValueError:  # telemetry off: no step is recorded
        return None
    return step_tap
