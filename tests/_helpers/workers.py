"""Process targets for tests that need real concurrent processes (multiprocessing spawn)."""

from __future__ import annotations

from multiprocessing.queues import Queue
from multiprocessing.synchronize import Barrier


def open_together(
    rounds: list[tuple[str, str]], barrier: Barrier, results: Queue[tuple[str, str]]
) -> None:
    """For each ``(url, how)``: wait for every process at the barrier, then open the store.

    ``how`` is ``"store"`` (``open_store``: pragmas and upgrade) or ``"connect"`` (one
    engine connection: the pragmas alone, which switch a new file to WAL).
    """
    from scalewatch.store import open_store
    from scalewatch.store.engine import make_engine

    for url, how in rounds:
        barrier.wait(timeout=120)
        try:
            if how == "store":
                with open_store(url) as store, store.read() as conn:
                    conn.exec_driver_sql("SELECT count(*) FROM runs").scalar_one()
            else:
                engine = make_engine(url)
                try:
                    with engine.connect() as conn:
                        assert conn.exec_driver_sql("PRAGMA journal_mode").scalar_one() == "wal"
                finally:
                    engine.dispose()
        except Exception as error:
            results.put((url, f"{type(error).__name__}: {error}"))
        else:
            results.put((url, "ok"))
