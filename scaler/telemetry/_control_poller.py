"""The control poller: hands the run's pending requests to the training thread.

Every ``interval_s`` it asks the writer's store whether the run has requests pending
(one statement on a connection it holds); a request that breaks a rule on its own
(written past the store's validation) is settled as rejected, never applied.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterable, Mapping
from typing import Any

from .._control import ControlOutcome, ControlSource, ControlUpdate
from .._control.inbox import ControlInbox
from ..store import control as store_control
from ..store.control_rules import check
from ..store.records import ControlRequestRow
from ._queue import CommandQueue, WriteOutcome
from ._writer import Writer

log = logging.getLogger("scalewatch.telemetry")


class Handout:
    """Hands each pending request to ``inbox`` once; one that breaks a rule on its own
    (written past the store's validation) is settled as rejected through ``queue``, never
    applied. Called by the thread that finds them: the poller, or a job's sender to the
    service (``_sender``), which finds them in the answers to its batches."""

    def __init__(self, queue: CommandQueue, inbox: ControlInbox) -> None:
        self._queue = queue
        self._inbox = inbox
        self._handed: set[int] = set()

    def __call__(self, pending: Iterable[tuple[int, Mapping[str, Any]]]) -> None:
        """``pending``: (request id, values) of each, oldest first."""
        for request_id, values in pending:
            if request_id in self._handed:
                continue
            self._handed.add(request_id)
            problem = check(values, {})
            if problem is None:
                self._inbox.post(ControlUpdate(request_id, values))
            else:
                outcome = ControlOutcome(
                    source=ControlSource.REQUEST,
                    request_id=request_id,
                    values=dict(values),
                    applied=False,
                    reason=problem,
                    state={},
                    version=0,
                )
                self._queue.put_outcome(WriteOutcome(None, time.time(), outcome))


class ControlPoller:
    """Polls the store that ``writer`` writes to, on a daemon thread."""

    def __init__(
        self,
        writer: Writer,
        queue: CommandQueue,
        inbox: ControlInbox,
        *,
        interval_s: float,
    ) -> None:
        self._writer = writer
        self._handout = Handout(queue, inbox)
        self._interval_s = interval_s
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._loop, name="scalewatch-poller", daemon=True)

    def _loop(self) -> None:
        probe: store_control.PendingProbe | None = None
        probed: tuple[int, tuple[int, int] | None] | None = None  # the store and file it reads
        writer = self._writer
        try:
            while not self.stop.wait(self._interval_s):
                store, run_id, file_id = writer.store, writer.run_id, writer.file_id
                if store is None or run_id is None:
                    continue
                try:
                    if probe is None or probed != (id(store), file_id):
                        _close_quietly(probe)
                        probe = None
                        probe, probed = store_control.PendingProbe(store), (id(store), file_id)
                    if not probe(run_id):
                        continue
                    pending = store_control.pending_requests(store, run_id)
                except Exception:  # a locked or missing store: try at the next poll
                    _close_quietly(probe)
                    probe = None
                    continue
                self._take(pending)
        finally:
            _close_quietly(probe)

    def _take(self, pending: list[ControlRequestRow]) -> None:
        self._handout((request.id, request.values) for request in pending)


def _close_quietly(probe: store_control.PendingProbe | None) -> None:
    if probe is None:
        return
    try:
        probe.close()
    except Exception:  # its store is gone already
        log.debug("scalewatch: could not close the control probe", exc_info=True)
