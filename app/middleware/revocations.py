"""Revocation, at once everywhere: the identities that may no longer be used, read again
from the store whenever its trail of identity events moves (a revocation by this service,
by another one, or by ``scalewatch tokens revoke`` on the store).

On a move, the cache of checked tokens is emptied, and every open stream is woken to ask
:meth:`Revocations.refusal` of its identity: a revoked or expired one's stream ends with
a last ``event: refused`` that says why. A ticket of such an identity is refused too.
The trail is looked at every ``POLL_S`` (one indexed ``max(id)``), and the identities read
only when it moved; an expiry that comes due wakes the streams as well.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

import anyio
from sqlalchemy.exc import DBAPIError

from scalewatch.store.engine import Store
from scalewatch.store.identities import Unusable, identities_mark, unusable_identities

from .identity import Identity, KnownTokens

__all__ = ["POLL_S", "Revocations"]

POLL_S = 0.5
log = logging.getLogger("scalewatch.app")


class Revocations:
    """The revoked and expiring identities of the store, as of its last move."""

    def __init__(self, known: KnownTokens) -> None:
        self.known = known
        self._state = Unusable(mark=-1, revoked=frozenset(), expiring={})
        self._expired = 0  # expiring identities past due at the last look

    def refusal(self, identity: Identity | None, now: float | None = None) -> str | None:
        """Why ``identity`` may no longer be used (None: it may; anonymous or the holder of
        SCALEWATCH_TOKEN always may)."""
        if identity is None or not identity.revocable:
            return None
        state = self._state
        if identity.name in state.revoked:
            return f"{identity.name!r} was revoked"
        expires = state.expiring.get(identity.name)
        if expires is not None and expires <= (time.time() if now is None else now):
            return f"{identity.name!r} has expired"
        return None

    def load(self, store: Store) -> bool:
        """Read the store's identities again if its trail moved (a worker thread's call);
        whether anything changed for the streams: the trail, or an expiry come due."""
        changed = False
        if identities_mark(store) != self._state.mark:  # a creation moves it too
            old, self._state = self._state, unusable_identities(store)
            changed = (old.revoked, old.expiring) != (self._state.revoked, self._state.expiring)
            if changed:
                self.known.forget()
        now = time.time()
        expired = sum(1 for when in self._state.expiring.values() if when <= now)
        due, self._expired = expired > self._expired, expired
        return changed or due

    async def watch(self, store: Store, wake: Callable[[], None]) -> None:
        """Look every ``POLL_S`` until cancelled; ``wake`` the streams on a change."""
        while True:
            try:
                if await anyio.to_thread.run_sync(self.load, store):
                    wake()
            except DBAPIError as error:  # the store is down a while: the last state holds
                log.warning("scalewatch: cannot read the identities: %s", type(error).__name__)
            await anyio.sleep(POLL_S)
