"""The control inbox: changes waiting for the next ``update()`` of a scaler.

Filled on two threads, emptied on the training thread of every rank: the reporting rank's
control poller posts the run's pending requests (``post``); a setter called by the training
script leaves its applied change for that step's record (``note_by_code``). A copy of a
scaler (pickle, deepcopy) gets an empty inbox.
"""

from __future__ import annotations

from collections import deque

from . import ControlOutcome, ControlUpdate


class ControlInbox:
    """Requests from the store, oldest first, and changes made by code since the last step.

    >>> inbox = ControlInbox()
    >>> inbox.post(ControlUpdate(7, {"growth_interval": 100}))
    >>> len(inbox), inbox.take_all()[0].request_id, bool(inbox)
    (1, 7, False)
    """

    __slots__ = ("_by_code", "_requests")

    def __init__(self) -> None:
        # deque: append and popleft are atomic, so the poller posts without a lock.
        self._requests: deque[ControlUpdate] = deque()
        self._by_code: list[ControlOutcome] = []

    def __len__(self) -> int:
        return len(self._requests)

    def __bool__(self) -> bool:
        return bool(self._requests)

    def post(self, update: ControlUpdate) -> None:
        """A pending request, from the control poller's thread."""
        self._requests.append(update)

    def take_one(self) -> ControlUpdate:
        """The oldest request (there must be one): what one broadcast carries."""
        return self._requests.popleft()

    def take_all(self) -> list[ControlUpdate]:
        """Every request waiting, oldest first; they leave the inbox."""
        taken: list[ControlUpdate] = []
        requests = self._requests
        while requests:
            taken.append(requests.popleft())
        return taken

    def note_by_code(self, outcome: ControlOutcome) -> None:
        """A setter's change, applied at once, recorded with the next step."""
        self._by_code.append(outcome)

    def take_by_code(self) -> tuple[ControlOutcome, ...]:
        """The changes made by code since the last step; they leave the inbox."""
        if not self._by_code:
            return ()
        taken, self._by_code = tuple(self._by_code), []
        return taken
