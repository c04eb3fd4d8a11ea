"""The control poller: hands the run's pending requests to the training thread.

Every ``interval_s`` it asks the writer's store whether the run has requests pending
(one statement on a connection it holds); a request that breaks a rule on its own
(written past the store's validation) is settled as rejected, never applied.
"""

from __future__ import annotations

import logging
import threading
import time

from .._control import ControlOutcome, ControlSource, ControlUpdate
from .._control.inbox import ControlInbox
from ..store import control as store_control
from ..store.control_rules import check
from ..store.records import ControlRequestRow
from ._queue import CommandQueue, WriteOutcome
from ._writer import Writer

log = logging.getLogger("scalewatch.telemetry")


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
        self._queue = queue
        self._inbox = inbox
        self._interval_s = interval_s
        self._handed: set[int] = set()
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
        for request in pending:
            if request.id in self._handed:
                continue
            self._handed.add(request.id)
            problem = check(request.values, {})
            if problem is None:
                self._inbox.post(ControlUpdate(request.id, request.values))
            else:  # written past the store's validation: settle it, never apply it
                outcome = ControlOutcome(
                    source=ControlSource.REQUEST,
                    request_id=request.id,
                    values=dict(request.values),
                    applied=False,
                    reason=problem,
                    state={},
                    version=0,
                )
                self._queue.put_outcome(WriteOutcome(None, time.time(), outcome))


def _close_quietly(probe: store_control.PendingProbe | None) -> None:
    if probe is None:
        return
    try:
        probe.close()
    except Exception:  # its store is gone already
        log.debug("scalewatch: could not close the control probe", exc_info=True)
