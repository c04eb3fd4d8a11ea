"""The threads that write a run's steps into its mirrors: one a mirror, on the reporting rank.

The run's telemetry hands each batch of what it was given to :meth:`MirrorFeed.put` from a
thread of its own, not the training thread (the sender thread of a writer process's run,
the recorder thread of a run written by a thread): one C call a batch, that never waits.
Each mirror's thread wakes every ``Mirror.interval_s``, makes the steps it found, and writes them
in one batch; a mirror that is slow holds only its own thread, and past ``max_pending``
steps not yet taken the oldest are dropped from its lane (counted in ``Mirror.dropped``).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from itertools import islice
from typing import Any

from ._base import Mirror, RunLinks, steps_of

log = logging.getLogger("scalewatch.mirrors")

DASHBOARD_ENV = "SCALEWATCH_DASHBOARD_URL"


class _Lane:
    """One mirror's queue and thread."""

    def __init__(self, mirror: Mirror, feed: MirrorFeed) -> None:
        self.mirror = mirror
        self.items: deque[Any] = deque()
        self._feed = feed
        self._described = False
        self.writing = 0  # steps taken and being written
        self.thread = threading.Thread(
            target=self._loop, name=f"scalewatch-mirror-{mirror.name}", daemon=True
        )

    def _loop(self) -> None:
        feed, mirror = self._feed, self.mirror
        while True:
            stopping = feed.stop.wait(mirror.interval_s)
            self._write(self._take())
            if not self._described:
                links = feed.links()
                if links.run_id is not None or stopping:
                    self._described = True
                    self.call(mirror.describe, links)
            if stopping:
                break
        self.call(mirror.close)

    def _take(self) -> list[Any]:
        items = self.items
        return list(islice(iter(items.popleft, None), len(items)))

    def _write(self, items: list[Any]) -> None:
        if items and not self.call(self._write_steps, items):
            self.mirror.dropped += self.writing
        self.writing = 0

    def _write_steps(self, items: list[Any]) -> None:
        steps = steps_of(items)
        self.writing = len(steps)
        if steps:
            self.mirror.write(steps)

    def call(self, method: Callable[..., None], *args: Any) -> bool:
        try:
            method(*args)
        except Exception as error:
            mirror = self.mirror
            mirror.failures += 1
            if mirror.failures == 1:
                log.warning(
                    "scalewatch: the %s mirror failed (%s: %s); scalewatch's own records are"
                    " kept, and its later failures only counted",
                    mirror.name,
                    type(error).__name__,
                    str(error).strip().partition("\n")[0],
                )
            return False
        return True


class MirrorFeed:
    """The mirrors of one run: attached on the training thread as the run opens, then
    written by a thread each. ``run`` tells the run's uid and, once created, its id."""

    def __init__(
        self,
        mirrors: Sequence[Mirror],
        run: Callable[[], tuple[str, int | None]],
        *,
        max_pending: int = 100_000,
    ) -> None:
        self.stop = threading.Event()
        self._run = run
        self._max_pending = max_pending
        self._dashboard = os.environ.get(DASHBOARD_ENV, "").rstrip("/") or None
        self._lanes = [_Lane(mirror, self) for mirror in mirrors]
        for lane in self._lanes:
            lane.call(lane.mirror.attach)  # a tracker's failure is no training's
        for lane in self._lanes:
            lane.thread.start()

    @property
    def threads(self) -> tuple[threading.Thread, ...]:
        return tuple(lane.thread for lane in self._lanes)

    def put(self, items: list[Any]) -> None:
        """What the run's telemetry was handed; from one of its threads, never blocks."""
        for lane in self._lanes:
            lane.items.extend(items)
            over = len(lane.items) - self._max_pending
            if over > 0:
                for _ in range(over):
                    lane.items.popleft()
                lane.mirror.dropped += over

    def links(self) -> RunLinks:
        uid, run_id = self._run()
        page = None
        if self._dashboard is not None and run_id is not None:
            page = f"{self._dashboard}/run.html?run={run_id}"
        return RunLinks(uid, run_id, page)

    def close(self, timeout: float = 10.0) -> None:
        """Write what is left and close the mirrors, waiting up to ``timeout`` for them."""
        self.stop.set()
        deadline = time.monotonic() + timeout
        for lane in self._lanes:
            lane.thread.join(max(0.0, deadline - time.monotonic()))
            if lane.thread.is_alive():
                left = len(lane.items) + lane.writing
                lane.mirror.dropped += left
                log.warning(
                    "scalewatch: the %s mirror did not finish in %g s; %d steps not mirrored",
                    lane.mirror.name,
                    timeout,
                    left,
                )
