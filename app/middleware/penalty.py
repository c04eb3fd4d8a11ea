"""Slowing down token guessing: a client whose wrong tokens pile up is refused (429) for a
while, before its token is even looked at, in a table of bounded size.

>>> penalty = FailurePenalty(free_failures=1, base_s=2.0)
>>> penalty.failed("10.0.0.7", now=100.0), penalty.failed("10.0.0.7", now=100.5)
(0.0, 2.0)
>>> penalty.locked_for("10.0.0.7", now=101.0), penalty.locked_for("10.0.0.8", now=101.0)
(1.5, 0.0)
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from dataclasses import dataclass

__all__ = ["FailurePenalty"]


@dataclass
class _Record:
    failures: int
    last_failure: float
    locked_until: float


class FailurePenalty:
    """Wrong tokens per client address. After ``free_failures`` of them (mistakes happen),
    each one locks the client out for ``base_s``, doubled each time up to ``max_s``. A
    client is forgotten ``forget_s`` after its last wrong token, on a right one, or, the
    table being full (``max_clients``: a flood from many addresses), when it is the one
    that failed longest ago.

    While locked out, a client's requests are refused whatever their token: a guess made
    then tells nothing, so running guesses side by side gains nothing.
    """

    def __init__(
        self,
        *,
        free_failures: int = 20,
        base_s: float = 1.0,
        max_s: float = 60.0,
        forget_s: float = 900.0,
        max_clients: int = 4096,
    ) -> None:
        self.free_failures, self.base_s, self.max_s = free_failures, base_s, max_s
        self.forget_s, self.max_clients = forget_s, max_clients
        self._clients: OrderedDict[str, _Record] = OrderedDict()
        self._lock = threading.Lock()  # the token check runs in the threadpool

    def __len__(self) -> int:
        return len(self._clients)

    def locked_for(self, client: str, now: float | None = None) -> float:
        """Seconds ``client`` is still locked out for (0.0: it may try)."""
        now = time.monotonic() if now is None else now
        with self._lock:
            record = self._clients.get(client)
            return max(0.0, record.locked_until - now) if record is not None else 0.0

    def failed(self, client: str, now: float | None = None) -> float:
        """Count a wrong token of ``client``; return the seconds it is now locked out for."""
        now = time.monotonic() if now is None else now
        with self._lock:
            record = self._clients.pop(client, None)
            if record is None or now - record.last_failure > self.forget_s:
                record = _Record(0, now, now)
            record.failures += 1
            record.last_failure = now
            over = record.failures - self.free_failures
            lock = min(self.max_s, self.base_s * 2.0 ** min(over - 1, 64)) if over > 0 else 0.0
            record.locked_until = now + lock
            self._clients[client] = record  # the newest failure last: evicted last
            while len(self._clients) > self.max_clients:
                self._clients.popitem(last=False)
            return lock

    def succeeded(self, client: str) -> None:
        with self._lock:
            self._clients.pop(client, None)
