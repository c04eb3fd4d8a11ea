"""New steps announced by PostgreSQL's LISTEN/NOTIFY, so live streams on any machine need
not poll the store several times a second per run.

A writer's step transaction sends ``NOTIFY scalewatch_steps, '<run id>'`` (delivered at
commit). A service process holds one listening connection per store, on a thread of its
own, and wakes the asyncio waiters of that run. SQLite has no such thing: there
:func:`subscribe` returns ``None`` and streams poll.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading

from sqlalchemy import Engine

from scaler.store.engine import Store
from scaler.store.postgres import STEPS_CHANNEL

__all__ = ["Listener", "Waiter", "subscribe", "unsubscribe"]
# How often the listening thread looks whether it should stop, and waits after losing
# its connection before it connects again.
_TICK_S = 0.5
_RECONNECT_S = 1.0

log = logging.getLogger("scaler.store")


class Waiter:
    """Woken (from any thread) when its run has new steps; awaited on its event loop."""

    def __init__(self, run_id: int, loop: asyncio.AbstractEventLoop) -> None:
        self.run_id = run_id
        self._loop = loop
        self._event = asyncio.Event()

    def wake(self) -> None:
        with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
            self._loop.call_soon_threadsafe(self._event.set)

    async def wait(self, timeout: float) -> bool:
        """Until woken or ``timeout`` s; True if woken. A wake-up while the caller was busy
        is kept, so nothing written between two reads is missed."""
        try:
            await asyncio.wait_for(self._event.wait(), timeout)
        except TimeoutError:
            return False
        finally:
            self._event.clear()
        return True


class Listener:
    """One LISTEN connection of a store's engine, while it has waiters."""

    def __init__(self, engine: Engine, first: Waiter) -> None:
        self._args, self._kwargs = engine.dialect.create_connect_args(engine.url)
        self.waiters: dict[int, set[Waiter]] = {first.run_id: {first}}
        self.listening = threading.Event()
        self._thread = threading.Thread(target=self._run, name="scalewatch-listen", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        import psycopg

        while self.waiters:
            try:
                with psycopg.connect(*self._args, **self._kwargs, autocommit=True) as conn:
                    conn.execute(f"LISTEN {STEPS_CHANNEL}")
                    self.listening.set()
                    self._wake_all()  # steps written while nobody listened
                    while self.waiters:
                        for note in conn.notifies(timeout=_TICK_S):
                            self._wake(note.payload)
            except psycopg.Error as error:
                self.listening.clear()
                log.warning("scalewatch: listening for new steps failed (%s); retrying", error)
                threading.Event().wait(_RECONNECT_S)
        self.listening.clear()

    def _wake(self, payload: str) -> None:
        with _LOCK:
            waiters = list(self.waiters.get(int(payload), ())) if payload.isdigit() else []
        for waiter in waiters:
            waiter.wake()

    def _wake_all(self) -> None:
        with _LOCK:
            waiters = [w for group in self.waiters.values() for w in group]
        for waiter in waiters:
            waiter.wake()

    def alive(self) -> bool:
        return self._thread.is_alive()


# Guards every store's listener and its waiters: taken briefly, by the event loops that
# subscribe and by the listening threads that wake them.
_LOCK = threading.Lock()


def subscribe(store: Store, run_id: int) -> Waiter | None:
    """A waiter for new steps of ``run_id`` on the running event loop; None on SQLite.

    The store holds its one listener (``store.listener``) while any waiter does."""
    if store.engine.dialect.name != "postgresql":
        return None
    waiter = Waiter(run_id, asyncio.get_running_loop())
    with _LOCK:
        listener = store.listener
        if listener is None or not listener.alive():
            store.listener = Listener(store.engine, waiter)
        else:
            listener.waiters.setdefault(run_id, set()).add(waiter)
    return waiter


def unsubscribe(store: Store, waiter: Waiter | None) -> None:
    """Forget ``waiter``; the listening connection closes with the store's last one."""
    if waiter is None:
        return
    with _LOCK:
        listener = store.listener
        if listener is None:
            return
        group = listener.waiters.get(waiter.run_id)
        if group is not None:
            group.discard(waiter)
            if not group:
                del listener.waiters[waiter.run_id]
        if not listener.waiters:
            store.listener = None
