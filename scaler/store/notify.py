"""New steps announced to live streams, so the service's reads of the store grow with the
runs it streams, not with its streams or their polls.

On PostgreSQL a writer's step transaction sends ``NOTIFY scalewatch_steps, '<run id>'``
(delivered at commit); a service process holds one listening connection per store, on a
thread of its own (:class:`Listener`), and wakes the asyncio waiters of that run. A
SQLite file has no such thing, and its writers are processes of the same host: one thread
per store (:class:`CommitWatcher`) reads every streamed run's last step in one statement every
``SQLITE_POLL_S`` and wakes the waiters of the runs that moved (each stream's hub polled
its run 20 times a second before: 1000 reads a second for 50 streamed runs). An in-memory
SQLite store has neither: there :func:`subscribe` returns ``None`` and streams poll.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sqlite3
import threading
from collections.abc import Iterable
from typing import Any

from sqlalchemy import Engine, exc

from .engine import Store
from .postgres import STEPS_CHANNEL

__all__ = [
    "SQLITE_POLL_S",
    "Announcer",
    "CommitWatcher",
    "Listener",
    "Waiter",
    "subscribe",
    "unsubscribe",
]
# How often the listening thread looks whether it should stop, and waits after losing
# its connection before it connects again.
_TICK_S = 0.5
_RECONNECT_S = 1.0
# How often a SQLite store's poller looks for commits (PRAGMA data_version) and, after
# one, reads its streamed runs' last steps: a step reaches a stream some 10 ms after its
# commit, for a statement or two 50 times a second whatever the number of streams.
SQLITE_POLL_S = 0.02

log = logging.getLogger("scalewatch.store")


class Waiter:
    """Woken (from any thread) when its run has new steps; awaited on its event loop."""

    def __init__(self, run_id: int, loop: asyncio.AbstractEventLoop) -> None:
        self.run_id = run_id
        self.announced: int | None = None  # the run's last step, as the last wake-up told it
        self._loop = loop
        self._event = asyncio.Event()

    def wake(self, last: int | None = None) -> None:
        """Wake the waiter; ``last``: the run's last step, where the announcer read it."""
        self.announced = last
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


class Announcer:
    """The waiters of one store, by run, and the thread that wakes them while it has any."""

    def __init__(self, first: Waiter, name: str) -> None:
        self.waiters: dict[int, set[Waiter]] = {first.run_id: {first}}
        self.listening = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def _run(self) -> None:
        raise NotImplementedError

    def _wake_runs(self, moved: Iterable[tuple[int, int | None]]) -> None:
        """Wake the waiters of each run of ``moved``: (run id, its last step or None)."""
        with _LOCK:
            waiters = [(w, last) for run_id, last in moved for w in self.waiters.get(run_id, ())]
        for waiter, last in waiters:
            waiter.wake(last)

    def _wake_all(self) -> None:
        with _LOCK:
            waiters = [w for group in self.waiters.values() for w in group]
        for waiter in waiters:
            waiter.wake()

    def alive(self) -> bool:
        return self._thread.is_alive()


class Listener(Announcer):
    """One LISTEN connection of a PostgreSQL store's engine, while it has waiters."""

    def __init__(self, engine: Engine, first: Waiter) -> None:
        super().__init__(first, "scalewatch-listen")
        self._args, self._kwargs = engine.dialect.create_connect_args(engine.url)
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
                            if note.payload.isdigit():
                                self._wake_runs(((int(note.payload), None),))
            except psycopg.Error as error:
                self.listening.clear()
                log.warning("scalewatch: listening for new steps failed (%s); retrying", error)
                threading.Event().wait(_RECONNECT_S)
        self.listening.clear()


class CommitWatcher(Announcer):
    """One thread of a SQLite file store's engine, while it has waiters: every
    ``SQLITE_POLL_S`` one read of the waiters' runs' last steps (``PRAGMA data_version``
    first: nothing at all when no other connection has committed since)."""

    def __init__(self, engine: Engine, first: Waiter) -> None:
        super().__init__(first, "scalewatch-poll")
        self._engine = engine
        self._thread.start()

    def _run(self) -> None:
        seen: dict[int, int] = {}
        while self.waiters:
            try:
                raw = self._engine.raw_connection()
                try:
                    self.listening.set()
                    self._wake_all()  # steps written before the first read
                    version = None
                    while self.waiters:
                        cursor = raw.cursor()
                        now = cursor.execute("PRAGMA data_version").fetchone()[0]
                        if now != version:
                            version = now
                            self._wake_runs(self._moved(cursor, seen))
                        cursor.close()
                        threading.Event().wait(SQLITE_POLL_S)
                finally:
                    raw.close()
            except (exc.SQLAlchemyError, sqlite3.Error) as error:  # unreadable: try again
                self.listening.clear()
                log.warning("scalewatch: watching for new steps failed (%s); retrying", error)
                threading.Event().wait(_RECONNECT_S)
        self.listening.clear()

    def _moved(self, cursor: Any, seen: dict[int, int]) -> list[tuple[int, int]]:
        """The runs whose last step differs from the one in ``seen`` (kept up to date),
        with that step."""
        with _LOCK:
            runs = sorted(self.waiters)
        if not runs:
            return []
        marks = ", ".join("?" * len(runs))
        rows = cursor.execute(
            f"SELECT id, last_step FROM runs WHERE id IN ({marks})", runs
        ).fetchall()
        moved = [(run_id, last) for run_id, last in rows if seen.get(run_id) != last]
        seen.clear()
        seen.update(rows)
        return moved


# Guards every store's listener and its waiters: taken briefly, by the event loops that
# subscribe and by the listening threads that wake them.
_LOCK = threading.Lock()


def subscribe(store: Store, run_id: int) -> Waiter | None:
    """A waiter for new steps of ``run_id`` on the running event loop; None on an
    in-memory SQLite store.

    The store holds its one listener or poller (``store.listener``) while any waiter does."""
    kind: type[Listener] | type[CommitWatcher]
    if store.engine.dialect.name == "postgresql":
        kind = Listener
    elif _is_file(store.engine):
        kind = CommitWatcher
    else:
        return None
    waiter = Waiter(run_id, asyncio.get_running_loop())
    with _LOCK:
        listener = store.listener
        if listener is None or not listener.alive():
            store.listener = kind(store.engine, waiter)
        else:
            listener.waiters.setdefault(run_id, set()).add(waiter)
    return waiter


def _is_file(engine: Engine) -> bool:
    database = engine.url.database or ""
    return bool(database) and database != ":memory:" and "mode=memory" not in database


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
