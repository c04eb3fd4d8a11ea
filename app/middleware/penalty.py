"""Slowing down token guessing: a client whose wrong credentials pile up is refused (429)
for a while, before a credential it has not used successfully is even looked at, in
tables of bounded size.

Failures are counted per client (behind a trusted proxy, the client it forwards for:
:mod:`.forwarded`), so one user's failures lock out nobody else. A lockout refuses new
credentials only: one that succeeded from the same client before (a viewer's own token)
still goes through, and a success clears nothing, so interleaving a right token with
guesses does not reset the count of guesses.

>>> penalty = FailurePenalty(free_failures=1, base_s=2.0)
>>> penalty.succeeded("10.0.0.7", "mine")
>>> penalty.failed("10.0.0.7", now=100.0), penalty.failed("10.0.0.7", now=100.5)
(0.0, 2.0)
>>> penalty.locked_for("10.0.0.7", "guess", now=101.0)
1.5
>>> penalty.locked_for("10.0.0.8", "guess", now=101.0)
0.0
>>> penalty.locked_for("10.0.0.7", "mine", now=101.0)
0.0
"""

from __future__ import annotations

import hashlib
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass

__all__ = ["FailurePenalty", "credential_key"]


def credential_key(secret: str) -> bytes:
    """What the tables keep of a credential: its SHA-256, never the credential."""
    return hashlib.sha256(secret.encode()).digest()


@dataclass
class _Record:
    failures: int
    last_failure: float
    locked_until: float


class FailurePenalty:
    """Wrong credentials per client. After ``free_failures`` of them (mistakes happen), each
    one locks the client out for ``base_s``, doubled each time up to ``max_s``. A client is
    forgotten ``forget_s`` after its last failure or, the table being full (``max_clients``:
    a flood from many addresses), when it is the one that failed longest ago.

    While locked out, a client's requests with a credential that has not succeeded from it
    (``max_good`` such pairs are remembered) are refused whatever they hold: a guess made then
    tells nothing, so running guesses side by side, or between right ones, gains nothing.
    """

    def __init__(
        self,
        *,
        free_failures: int = 20,
        base_s: float = 1.0,
        max_s: float = 60.0,
        forget_s: float = 900.0,
        max_clients: int = 4096,
        max_good: int = 16_384,
    ) -> None:
        self.free_failures, self.base_s, self.max_s = free_failures, base_s, max_s
        self.forget_s, self.max_clients, self.max_good = forget_s, max_clients, max_good
        self._clients: OrderedDict[str, _Record] = OrderedDict()
        self._good: OrderedDict[tuple[str, bytes | str], None] = OrderedDict()
        self._lock = threading.Lock()  # the token check runs in the threadpool

    def __len__(self) -> int:
        return len(self._clients)

    def locked_for(
        self, client: str, credential: bytes | str | None = None, now: float | None = None
    ) -> float:
        """Seconds ``client`` is still locked out for with ``credential`` (0.0: it may try;
        a credential that succeeded from ``client`` before may always try)."""
        now = time.monotonic() if now is None else now
        with self._lock:
            record = self._clients.get(client)
            if record is None or record.locked_until <= now:
                return 0.0
            if credential is not None and (client, credential) in self._good:
                return 0.0
            return record.locked_until - now

    def failed(self, client: str, now: float | None = None) -> float:
        """Count a wrong credential of ``client``; return the seconds it is now locked out for."""
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

    def succeeded(self, client: str, credential: bytes | str) -> None:
        """``credential`` was right from ``client``: it may go on while the client is locked."""
        key = (client, credential)
        with self._lock:
            if key in self._good:
                self._good.move_to_end(key)
                return
            self._good[key] = None
            while len(self._good) > self.max_good:
                self._good.popitem(last=False)
